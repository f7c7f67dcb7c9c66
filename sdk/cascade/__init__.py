"""The cascade: one chat request across the local and the cloud tier.

- `runner`: `CascadeRunner`, what requests share (breaker, costs, privacy counters, models);
  `request`: one request's flow; `local` / `cloud`: driving each tier's stream.
- `config`: `CascadeConfig`; `types`: `RoutingInfo`, `CascadeEvent`, `CascadeResult`;
  `counts`: route counters; `models`: loading the probe and the prompt router.
- `openai`: cascade answers in OpenAI's shapes (shared by `sdk.client` and the HTTP server);
  `responses`: those shapes plus the `tandem` routing field.
"""

from __future__ import annotations

from sdk.lazy_exports import lazy_getattr

_EXPORTS = {
    "CascadeRunner": "sdk.cascade.runner",
    "CascadeConfig": "sdk.cascade.config",
    "CascadeEvent": "sdk.cascade.types",
    "CascadeResult": "sdk.cascade.types",
    "RoutingInfo": "sdk.cascade.types",
    "collect": "sdk.cascade.types",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
