"""One cloud call of the cascade, with the circuit breaker told of every outcome.

Health failures (unreachable, deadline, overload, server errors) and rejected
credentials become `CloudFailed`, which the runner turns into a degraded local answer;
an invalid argument is the caller's error and propagates as the InvalidRequestError it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from router.circuit_breaker import CircuitBreaker
from router.failure_kinds import FailureKind, classify_failure
from sdk.cloud.grpc_client import CloudClient, CloudError, CloudInvalidArgumentError, CloudTokenEvent
from sdk.protocol.engine import SamplingParams

logger = logging.getLogger("tandem.router")

# RoutingInfo.degraded_reason for each kind of cloud failure.
DEGRADED_REASONS = {
    FailureKind.UNAVAILABLE: "cloud_unavailable",
    FailureKind.DEADLINE: "cloud_timeout",
    FailureKind.OVERLOADED: "cloud_overloaded",
    FailureKind.AUTH: "cloud_auth",
    FailureKind.INTERNAL: "cloud_error",
}


RETRY_BACKOFF_S = 0.05  # before the one retry of a call the cloud could not take


class CloudFailed(Exception):
    """The cloud could not answer; `reason` is the degraded_reason to report."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class CloudUsage:
    """Tokens of one cloud call, for the cost ledger (also when it failed part-way)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


def refusal_reason(client: CloudClient | None, breaker: CircuitBreaker) -> str | None:
    """Why the cloud must not be called now, or None (then a half-open trial is ours: report it)."""
    if client is None:
        return "no_cloud"
    if breaker.auth_disabled:
        return "cloud_auth"
    if not breaker.allow():
        return "circuit_open"
    return None


async def stream_from_cloud(
    client: CloudClient,
    breaker: CircuitBreaker,
    prompt: list[dict],
    params: SamplingParams,
    usage: CloudUsage,
    *,
    model: str,
    request_id: str,
    continuation_token_ids: Sequence[int],
    timeout_s: float,
    retry_backoff_s: float = RETRY_BACKOFF_S,
) -> AsyncIterator[CloudTokenEvent]:
    """The cloud's tokens as they come; call only after refusal_reason() returned None.

    A call the cloud could not even take (UNAVAILABLE before its first token: a dropped
    connection, a server restarting) is retried once after `retry_backoff_s`: nothing has
    reached the client, so it is idempotent. Deadlines are not retried (the wait would
    double), nor is anything after the first token."""
    reported = False
    try:
        for attempt in range(2):
            started = False
            try:
                async for event in client.generate(
                    prompt, params, model=model, request_id=request_id,
                    continuation_token_ids=continuation_token_ids, timeout_s=timeout_s,
                ):  # fmt: skip
                    started = True
                    # An HTTP cloud may send fewer chunks than tokens; its own count wins when it has one.
                    usage.completion_tokens = max(usage.completion_tokens + 1, event.num_output_tokens or 0)
                    usage.prompt_tokens = event.num_prompt_tokens or usage.prompt_tokens
                    yield event
                break
            except CloudError as error:
                if attempt == 0 and not started and classify_failure(error) is FailureKind.UNAVAILABLE:
                    await asyncio.sleep(retry_backoff_s)
                    continue
                raise
        breaker.record_success()
        reported = True
    except CloudInvalidArgumentError:
        breaker.record_failure(FailureKind.INVALID_ARGUMENT)  # frees a half-open trial, counts nothing
        reported = True
        raise
    except CloudError as error:
        kind = classify_failure(error)
        if kind is FailureKind.AUTH:
            breaker.record_auth_failure(error.code.name)  # escalation stays off until breaker.reset()
        else:
            breaker.record_failure(kind)
        reported = True
        raise CloudFailed(DEGRADED_REASONS.get(kind, "cloud_error")) from error
    except Exception as error:  # a client that let something else through (garbage it could not read)
        logger.warning("the cloud client failed with %s: %s; answering locally", type(error).__name__, error)
        kind = classify_failure(error)  # OSError: unavailable, TimeoutError: deadline, the rest: internal
        breaker.record_failure(kind)
        reported = True
        raise CloudFailed(DEGRADED_REASONS.get(kind, "cloud_error")) from error
    finally:
        if not reported:  # cancelled or closed early: no outcome, but free a half-open trial
            breaker.record_abandoned()
