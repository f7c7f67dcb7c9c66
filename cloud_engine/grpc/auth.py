"""API-key authentication of the gRPC service: `authorization: Bearer KEY` call metadata.

Health checks and reflection stay public, so load balancers and grpcurl-style tools work
without a key. Keys are checked with sdk.protocol.api_keys (constant time) and never logged: only
their fingerprints are.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc

from sdk.protocol.api_keys import bearer_token, key_fingerprint, matching_key

logger = logging.getLogger(__name__)

AUTHORIZATION_KEY = "authorization"
PUBLIC_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without a configured key with UNAUTHENTICATED, before the handler runs."""

    def __init__(self, api_keys: frozenset[str]):
        self.api_keys = api_keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not self.api_keys or details.method.startswith(PUBLIC_METHOD_PREFIXES):
            return handler
        header = _metadata_value(details.invocation_metadata, AUTHORIZATION_KEY)
        presented = bearer_token(header)
        key = matching_key(presented, self.api_keys)
        if key is not None:
            logger.debug("%s by key %s", details.method, key_fingerprint(key))
            return handler
        if presented is None:
            message = "this server needs an API key: send the metadata `authorization: Bearer <key>`"
        else:
            message = "the API key is not valid"
            logger.warning("%s refused: unknown API key %s", details.method, key_fingerprint(presented))
        return _refusing(handler, message)


def _metadata_value(metadata, key: str) -> str | None:
    for item_key, value in metadata or ():
        if item_key == key:
            return value.decode() if isinstance(value, bytes) else value
    return None


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends the call with UNAUTHENTICATED.

    It takes the request as raw bytes: nothing an unauthenticated caller sent gets parsed.
    """

    async def refuse(request_or_iterator, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, response_serializer=serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, response_serializer=serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, response_serializer=serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, response_serializer=serializer)
