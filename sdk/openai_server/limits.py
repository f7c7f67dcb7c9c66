"""Abuse limits the request schema cannot express: body size, and the 429 for requests in flight.

- Body size: a request whose Content-Length is over `max_body_bytes` is refused (413)
  before a byte of its body is read; a chunked body (no Content-Length) is counted as it
  arrives and refused as soon as it passes the limit. So at most `max_body_bytes` of a
  request is ever held in memory. The schema's own limits (n, stop, logprobs) and the
  context-length checks run later, on the parsed body.
- In flight: at most `max_in_flight` requests per client (its API key, or its address
  without keys) are being served at once: streaming or not, from the moment the request
  passes the access checks until its response has ended however it ended (finished,
  failed, client gone). One more is 429 at once; nothing queues. The count is the process's
  AccessGate's (sdk.serving.access_gate, asked by access.AccessControl); its answer is here.

BodySizeLimit is plain ASGI middleware (like access.AccessControl): it never wraps the response,
so streaming and client-disconnect detection behave exactly as without it.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sdk.openai_server.errors import OpenAIError

logger = logging.getLogger(__name__)

# A 4096-token context is at most ~100 KB of JSON for ordinary text (a token is ~4 bytes,
# ~24 bytes when every character is a \uXXXX escape) and ~30 KB as token ids. 4 MiB
# leaves room for the cloud tier's longer contexts (a 32k-token prompt escaped) and
# long chat histories, and matches gRPC's own message limit (sdk.serving.grpc.server).
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


def request_too_large(limit: int, size: int | None = None) -> OpenAIError:
    """OpenAI's shape for a body over the limit (413; the connection closes after it)."""
    got = f" (this one is {size} bytes)" if size is not None else ""
    return OpenAIError(
        413,
        f"The request body is larger than this server accepts: at most {limit} bytes{got}. "
        "Send a shorter prompt (the server's max_body_bytes setting sets the limit).",
        code="request_too_large",
        headers={"Connection": "close"},  # its unread rest cannot be skipped on a kept-alive connection
    )


def too_many_in_flight(limit: int, per_key: bool = True) -> OpenAIError:
    """429 for a client (its key, or its address without keys) that already has `limit` requests being served."""
    who = "this API key" if per_key else "this client address"
    return OpenAIError(
        429,
        f"Too many concurrent requests for {who}: at most {limit} may be in flight at once "
        "(the server's max_concurrent_per_key setting). Wait for one to finish, then retry.",
        type="requests",
        code="concurrency_limit_exceeded",
        headers={"Retry-After": "1"},
    )


class BodySizeLimit:
    """ASGI middleware: 413 for a body over `max_body_bytes`, without reading more than that."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, on_reject=None):
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.on_reject = on_reject  # called with "too_large" (the app's rejection counter)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(scope, receive, send, declared)
            return
        # Read the whole (bounded) body here: the handlers would read all of it anyway to parse the JSON.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body was in: nobody to answer
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                await self._refuse(scope, receive, send, None)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replaying(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int | None) -> None:
        if self.on_reject is not None:
            self.on_reject("too_large")
        client = (scope.get("client") or ("unknown", 0))[0]
        logger.info(
            "413 for %s %s from %s: body over %d bytes",
            scope.get("method"),
            scope.get("path"),
            client,
            self.max_body_bytes,
        )
        await request_too_large(self.max_body_bytes, size).response()(scope, receive, send)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands over the already-read body once, then the client's own channel
    (so a streaming response still hears the disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (h11/httptools) refuses a malformed one itself
    return None
