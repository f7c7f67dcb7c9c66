"""Engine errors -> gRPC status codes, for the servicer.

The status message is for people; the trailing metadata (sdk.protocol.wire.status, the keys
both sides share) is for programs: the SDK's `CloudClient` rebuilds the engine exception from it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import grpc

from sdk.protocol.engine import (
    ContextLengthError,
    EngineNotReadyError,
    EngineOverloadedError,
    InvalidRequestError,
    QuotaExceededError,
    StateUnavailableError,
)
from sdk.protocol.wire.status import (
    CONTEXT_LENGTH_TYPE,
    ERROR_PARAM_KEY,
    ERROR_TYPE_KEY,
    INSUFFICIENT_QUOTA_TYPE,
    INVALID_REQUEST_TYPE,
    MODEL_NOT_FOUND_TYPE,
    NOT_READY_TYPE,
    OVERLOADED_TYPE,
    RETRY_AFTER_KEY,
    STATE_UNAVAILABLE_TYPE,
)

logger = logging.getLogger(__name__)

# Status messages echo request values (a model name, a role): bounded, since gRPC sends the message
# percent-encoded in trailing metadata and a client refuses metadata over its limit (8 KiB by default),
# which turned a 60 kB model name's NOT_FOUND into RESOURCE_EXHAUSTED "Stream removed".
MAX_STATUS_MESSAGE_BYTES = 1000


class ModelNotFoundError(InvalidRequestError):
    """The request names a model this server does not serve (gRPC NOT_FOUND)."""


@dataclass
class RpcStatus:
    """What the servicer aborts a call with."""

    code: grpc.StatusCode
    message: str
    metadata: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        self.message = bounded_message(self.message)


def bounded_message(message: str) -> str:
    """`message` cut to MAX_STATUS_MESSAGE_BYTES of UTF-8 (on a character boundary), marked when cut."""
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    return data[:MAX_STATUS_MESSAGE_BYTES].decode("utf-8", "ignore") + "... (truncated)"


def status_for(exc: BaseException) -> RpcStatus:
    """The status for anything a request raised; unexpected errors are logged and never described."""
    if isinstance(exc, ModelNotFoundError):
        return RpcStatus(grpc.StatusCode.NOT_FOUND, str(exc), _typed(MODEL_NOT_FOUND_TYPE, exc.param))
    if isinstance(exc, InvalidRequestError):  # ContextLengthError included
        kind = CONTEXT_LENGTH_TYPE if isinstance(exc, ContextLengthError) else INVALID_REQUEST_TYPE
        where = f" (field: {exc.param})" if exc.param else ""
        return RpcStatus(grpc.StatusCode.INVALID_ARGUMENT, f"{exc}{where}", _typed(kind, exc.param))
    if isinstance(exc, EngineOverloadedError):
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return RpcStatus(
            grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), _typed(OVERLOADED_TYPE) + ((RETRY_AFTER_KEY, retry),)
        )
    if isinstance(exc, QuotaExceededError):
        return RpcStatus(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), _typed(INSUFFICIENT_QUOTA_TYPE))
    if isinstance(exc, StateUnavailableError):
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return RpcStatus(
            grpc.StatusCode.UNAVAILABLE, str(exc), _typed(STATE_UNAVAILABLE_TYPE) + ((RETRY_AFTER_KEY, retry),)
        )
    if isinstance(exc, EngineNotReadyError):
        return RpcStatus(grpc.StatusCode.UNAVAILABLE, str(exc), _typed(NOT_READY_TYPE) + ((RETRY_AFTER_KEY, "1"),))
    # The traceback may hold prompt text or paths: it goes to the log, the client gets a generic line.
    logger.error("unexpected error while serving a gRPC request", exc_info=exc)
    return RpcStatus(
        grpc.StatusCode.INTERNAL, f"the server hit an internal error ({type(exc).__name__}); it was logged"
    )


def _typed(kind: str, param: str | None = None) -> tuple[tuple[str, str], ...]:
    return ((ERROR_TYPE_KEY, kind),) + (((ERROR_PARAM_KEY, param),) if param else ())
