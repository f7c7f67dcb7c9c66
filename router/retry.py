"""Retrying cloud calls, only where a retry cannot do harm.

A retry is safe only for an idempotent call (nothing delivered to the client yet, no side
effects) that failed in a transient way (unavailable, deadline). Everything else fails
at once so the router can answer locally, marked degraded, without making the user wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from router.circuit_breaker import CircuitBreaker, CircuitOpenError
from router.failure_kinds import RETRYABLE_KINDS, FailureKind, classify_failure, http_status_of

T = TypeVar("T")


async def retry_with_backoff(
    fn: Callable[[], Awaitable[T]],
    attempts: int = 3,
    base_s: float = 0.1,
    max_s: float = 2.0,
    idempotent: bool = False,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    breaker: CircuitBreaker | None = None,
    classify: Callable[[BaseException], FailureKind] = classify_failure,
) -> T:
    """Await fn(), retrying retryable failures (unavailable, deadline) if idempotent.

    Waits base_s, 2*base_s, 4*base_s, ... capped at max_s between tries. A call that is not
    idempotent (a stream that already delivered tokens, anything with side effects) is
    tried once. With a breaker, each try asks `allow()` first and reports its outcome;
    `CircuitOpenError` is raised when the first try is refused, the last failure when a
    retry is. The last failure is re-raised when retrying stops."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    if not 0 <= base_s <= max_s:
        raise ValueError(f"need 0 <= base_s <= max_s, got base_s={base_s}, max_s={max_s}")
    last_error: Exception | None = None
    for attempt in range(attempts):
        if breaker is not None and not breaker.allow():
            if last_error is None:
                raise CircuitOpenError(breaker.state)
            raise last_error
        try:
            result = await fn()
        except Exception as error:
            kind = classify(error)
            if breaker is not None:
                if kind is FailureKind.AUTH:
                    breaker.record_auth_failure(_auth_status(error))
                else:
                    breaker.record_failure(kind)
            if not idempotent or kind not in RETRYABLE_KINDS or attempt == attempts - 1:
                raise
            last_error = error
            await sleep(min(max_s, base_s * 2**attempt))
        except BaseException:  # cancelled: no outcome to report, but free a half-open trial
            if breaker is not None:
                breaker.record_abandoned()
            raise
        else:
            if breaker is not None:
                breaker.record_success()
            return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def _auth_status(error: BaseException) -> int | str | None:
    """401/403, or the gRPC code name, for the log line."""
    return http_status_of(error) or getattr(getattr(error, "code", None), "name", None)
