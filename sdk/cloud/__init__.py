"""Reaching a cloud tier from the product.

- `grpc_client`: `CloudClient`, the async gRPC client of `tandem.v1` and its typed errors
  (`CloudError` and subclasses) that the cascade acts on.
- `openai_client` / `openai_wire`: `OpenAICloudClient`, any OpenAI-compatible HTTP server as a
  cloud tier, with the same events and errors.
- `tier`: starting the tier `tandem serve` was configured with (embedded engine, gRPC, HTTP, none).
"""

from __future__ import annotations

from sdk.lazy_exports import lazy_getattr

_EXPORTS = {
    "CloudClient": "sdk.cloud.grpc_client",
    "CloudError": "sdk.cloud.grpc_client",
    "OpenAICloudClient": "sdk.cloud.openai_client",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
