"""Reaching a cloud tier from the product.

Each client is a `CloudBackend` (sdk.protocol.cloud_backend, where the events and the typed
errors the cascade acts on, `CloudError` and subclasses, are declared):
- `grpc_client`: `CloudClient`, the async gRPC client of `tandem.v1`.
- `openai_client` / `openai_wire`: `OpenAICloudClient`, any OpenAI-compatible HTTP server as a
  cloud tier, with the same events and errors.
- `tier`: starting the tier `tandem serve` was configured with (embedded engine, gRPC, HTTP, none).
"""

from __future__ import annotations

from sdk.lazy_exports import lazy_getattr

_EXPORTS = {
    "CloudClient": "sdk.cloud.grpc_client",
    "CloudBackend": "sdk.protocol.cloud_backend",
    "CloudError": "sdk.protocol.cloud_backend",
    "OpenAICloudClient": "sdk.cloud.openai_client",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
