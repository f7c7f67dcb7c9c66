"""The OpenAI-shaped client apps embed: `AsyncClient` (async_client) and its synchronous twin
`Client` (sync_client), over a `CascadeRunner` in this process or a `tandem serve` endpoint
(http). Responses are `sdk.cascade.responses`' models."""

from __future__ import annotations

from sdk.lazy_exports import lazy_getattr

_EXPORTS = {
    "AsyncClient": "sdk.client.async_client",
    "Client": "sdk.client.sync_client",
    "TandemChatCompletion": "sdk.cascade.responses",
    "TandemChatCompletionChunk": "sdk.cascade.responses",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
