"""Access to the gRPC service: `authorization: Bearer KEY` call metadata, per-client rate and
concurrency limits, all decided by the process's sdk.serving.access_gate.AccessGate (the
one its HTTP listener asks too, so a key has one budget across both).

Health checks and reflection stay public and unlimited, so load balancers and grpcurl-style
tools work without a key. A refused call ends with UNAUTHENTICATED, or RESOURCE_EXHAUSTED
with `retry-after` (whole seconds) and `tandem-error-type` in its trailing metadata; the
request's bytes are parsed only once the call is admitted. An admitted call holds its
in-flight slot until its handler returns, however it returns (finished, failed, cancelled).
"""

from __future__ import annotations

import contextvars
import inspect
import math
import urllib.parse
from collections.abc import Awaitable, Callable

import grpc

from sdk.protocol.wire.status import ERROR_TYPE_KEY, RETRY_AFTER_KEY
from sdk.serving.access_gate import AUTH_BACKOFF, RATE_LIMITED, UNAUTHENTICATED, AccessGate, Refusal
from sdk.serving.api_keys import bearer_token, key_fingerprint

AUTHORIZATION_KEY = "authorization"
PUBLIC_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

# The admitted call's key id, the key's whole SHA-256 (None without keys), for the servicer to bill the request
# to (GenerationRequest.caller): set in the call's own task, before its handler runs.
CALLER_KEY_FINGERPRINT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tandem_grpc_caller_key", default=None
)


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Runs every non-public call through the AccessGate before its handler."""

    def __init__(self, gate: AccessGate):
        self.gate = gate

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not self.gate.active or details.method.startswith(PUBLIC_METHOD_PREFIXES):
            return handler
        presented = bearer_token(_metadata_value(details.invocation_metadata, AUTHORIZATION_KEY))
        return _gated(handler, self.gate, presented, details.method)


def peer_host(peer: str | None) -> str:
    """The host of a grpc peer string ("ipv4:127.0.0.1:5000", "ipv6:%5B::1%5D:5000" (gRPC
    percent-encodes the brackets), "unix:/path"): the port differs per connection, the host does not."""
    if not peer:
        return "unknown"
    scheme, _, rest = peer.partition(":")
    rest = urllib.parse.unquote(rest)
    if scheme == "ipv6":
        return rest.rpartition("]")[0].lstrip("[") or rest
    if scheme == "ipv4":
        return rest.rpartition(":")[0] or rest
    return scheme  # a unix socket's peers share one identity: "unix"


def rpc_refusal(refusal: Refusal) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """The status, message and trailing metadata a refused call ends with."""
    if refusal.kind == UNAUTHENTICATED:
        if refusal.key_presented:
            return grpc.StatusCode.UNAUTHENTICATED, "the API key is not valid", ()
        return (
            grpc.StatusCode.UNAUTHENTICATED,
            "this server needs an API key: send the metadata `authorization: Bearer <key>`",
            (),
        )
    retry = str(max(1, math.ceil(refusal.retry_after_s)))
    who = "this API key" if refusal.per_key else "this client address"
    if refusal.kind == AUTH_BACKOFF:
        message = (
            "too many calls with a wrong or missing API key from this address: the key was not checked; "
            f"retry in {retry}s"
        )
    elif refusal.kind == RATE_LIMITED:
        message = f"rate limit reached for {who}: {refusal.limit:g} requests a minute; retry in {retry}s"
    else:
        message = f"too many concurrent requests for {who}: at most {refusal.limit:g} in flight at once"
    return grpc.StatusCode.RESOURCE_EXHAUSTED, message, ((ERROR_TYPE_KEY, refusal.kind), (RETRY_AFTER_KEY, retry))


def _metadata_value(metadata, key: str) -> str | None:
    for item_key, value in metadata or ():
        if item_key == key:
            return value.decode() if isinstance(value, bytes) else value
    return None


def _gated(
    handler: grpc.RpcMethodHandler, gate: AccessGate, presented: str | None, method: str
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that asks the gate first (it needs the peer, which
    only the call's context knows). Unary requests arrive as raw bytes and are parsed after admission."""
    kind = (
        ("stream" if handler.request_streaming else "unary")
        + "_"
        + ("stream" if handler.response_streaming else "unary")
    )
    behavior = getattr(handler, kind)
    parse = None if handler.request_streaming else handler.request_deserializer

    async def admit(context: grpc.aio.ServicerContext):
        admission = await gate.admit(presented, peer_host(context.peer()), method)
        if admission.refusal is not None:
            code, message, metadata = rpc_refusal(admission.refusal)
            await context.abort(code, message, trailing_metadata=metadata)  # raises
        if gate.api_keys:
            CALLER_KEY_FINGERPRINT.set(key_fingerprint(admission.client))
        return admission

    if inspect.isasyncgenfunction(behavior):

        async def gated(request, context):
            admission = await admit(context)
            try:
                async for response in behavior(parse(request) if parse else request, context):
                    yield response
            finally:
                gate.release(admission)
    else:

        async def gated(request, context):
            admission = await admit(context)
            try:
                return await behavior(parse(request) if parse else request, context)
            finally:
                gate.release(admission)

    make = getattr(grpc, f"{kind}_rpc_method_handler")
    options = {"response_serializer": handler.response_serializer}
    if handler.request_streaming:
        options["request_deserializer"] = handler.request_deserializer
    return make(gated, **options)
