"""What an app imports: `sdk.Client` / `sdk.AsyncClient` (the OpenAI-shaped API over the cascade),
plus the shared engine protocol, OpenAI schema and server that both tiers use.

Exports are resolved lazily, so `import sdk.cli` (the `tandem` command) stays light.
"""

from __future__ import annotations

_EXPORTS = {"Client": "sdk.client_sync", "AsyncClient": "sdk.client"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sdk' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
