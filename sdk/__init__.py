"""tandem's SDK: the contracts at the bottom (`sdk.protocol`), the product on top.

What an app imports: `sdk.Client` / `sdk.AsyncClient`, the OpenAI-shaped API over the cascade.
The rest: `sdk.cascade` (a request across the tiers), `sdk.cloud` (reaching a cloud tier),
`sdk.client`, `sdk.openai_server`, `sdk.cli`, `sdk.settings`, `sdk.evaluation`.

Exports are resolved lazily, so `import sdk.protocol` never loads the product and
`import sdk.cli` (the `tandem` command) stays light.
"""

from __future__ import annotations

from sdk.lazy_exports import lazy_getattr

_EXPORTS = {"Client": "sdk.client.sync_client", "AsyncClient": "sdk.client.async_client"}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
