"""What kind of failure a cloud call ended with, decided from the exception alone.

The router acts on the kind, not the exception class: the SDK's `CloudError` carries a
gRPC status code, HTTP clients carry a status, and sockets raise OS errors. Duck typing
keeps this module free of grpc and the SDK, so the router stays importable on a device.
"""

from __future__ import annotations

import asyncio
from enum import Enum


class FailureKind(str, Enum):
    """Why a cloud call failed, at the granularity the router acts on."""

    UNAVAILABLE = "unavailable"  # unreachable, refused, shutting down, still loading
    DEADLINE = "deadline"  # ran past its deadline
    OVERLOADED = "overloaded"  # queue full or rate limited: the cloud asked us to back off
    INVALID_ARGUMENT = "invalid_argument"  # the request can never succeed as sent
    AUTH = "auth"  # credentials missing, wrong or not allowed (401/403)
    INTERNAL = "internal"  # anything else the cloud got wrong


# Transient by nature, so the same call may succeed on another try. Overloaded is left out
# on purpose: the cloud asked for less traffic, and the local answer is ready now.
RETRYABLE_KINDS = frozenset({FailureKind.UNAVAILABLE, FailureKind.DEADLINE})

# Failures that say the cloud tier is unhealthy and so count towards opening the breaker;
# an invalid argument is the request's fault and auth has its own disabled state.
HEALTH_FAILURE_KINDS = frozenset(
    {FailureKind.UNAVAILABLE, FailureKind.DEADLINE, FailureKind.OVERLOADED, FailureKind.INTERNAL}
)

_GRPC_CODE_KINDS = {
    "UNAVAILABLE": FailureKind.UNAVAILABLE,
    "DEADLINE_EXCEEDED": FailureKind.DEADLINE,
    "RESOURCE_EXHAUSTED": FailureKind.OVERLOADED,
    "UNAUTHENTICATED": FailureKind.AUTH,
    "PERMISSION_DENIED": FailureKind.AUTH,
    "INVALID_ARGUMENT": FailureKind.INVALID_ARGUMENT,
    "NOT_FOUND": FailureKind.INVALID_ARGUMENT,
    "OUT_OF_RANGE": FailureKind.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": FailureKind.INVALID_ARGUMENT,
}
_HTTP_STATUS_KINDS = {
    401: FailureKind.AUTH,
    403: FailureKind.AUTH,
    408: FailureKind.DEADLINE,
    429: FailureKind.OVERLOADED,
    502: FailureKind.UNAVAILABLE,
    503: FailureKind.UNAVAILABLE,
    504: FailureKind.DEADLINE,
}


def classify_failure(error: BaseException) -> FailureKind:
    """The kind of a cloud call's exception (gRPC status code, HTTP status or OS error)."""
    code = getattr(error, "code", None)
    code_name = getattr(code, "name", None)  # grpc.StatusCode members; codes are not called
    if isinstance(code_name, str):
        return _GRPC_CODE_KINDS.get(code_name, FailureKind.INTERNAL)
    status = http_status_of(error)
    if status is not None:
        if status in _HTTP_STATUS_KINDS:
            return _HTTP_STATUS_KINDS[status]
        return FailureKind.INVALID_ARGUMENT if 400 <= status < 500 else FailureKind.INTERNAL
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)):  # the same class since 3.11
        return FailureKind.DEADLINE
    if isinstance(error, OSError):  # ConnectionRefusedError, ConnectionResetError, DNS, ...
        return FailureKind.UNAVAILABLE
    return FailureKind.INTERNAL


def http_status_of(error: BaseException) -> int | None:
    """The HTTP status an exception carries (openai's `status_code`, httpx's `response`)."""
    status = getattr(error, "status_code", None)
    if status is None:
        status = getattr(getattr(error, "response", None), "status_code", None)
    return status if isinstance(status, int) else None
