"""One cloud call of the cascade, with the circuit breaker told of every outcome.

Health failures (unreachable, deadline, overload, server errors) and rejected
credentials become `CloudFailed`, which the runner turns into a degraded local answer;
an invalid argument is the caller's error and propagates as the InvalidRequestError it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from router.circuit_breaker import BreakerState, CircuitBreaker
from router.failure_kinds import FailureKind, classify_failure
from sdk.cascade.device_drafts import DraftedAnswer
from sdk.protocol.cloud_backend import (
    CloudBackend,
    CloudError,
    CloudInvalidArgumentError,
    CloudQuotaExceededError,
    CloudTokenEvent,
)
from sdk.protocol.engine import SamplingParams, StructuredOutput

logger = logging.getLogger("tandem.router")

# RoutingInfo.degraded_reason for each kind of cloud failure.
DEGRADED_REASONS = {
    FailureKind.UNAVAILABLE: "cloud_unavailable",
    FailureKind.DEADLINE: "cloud_deadline",
    FailureKind.OVERLOADED: "cloud_overloaded",
    FailureKind.AUTH: "cloud_auth",
    FailureKind.INTERNAL: "cloud_error",
}

QUOTA_REASON = (
    "cloud_quota_exhausted"  # the cloud refused the tier's key: its budget there is spent (429 insufficient_quota)
)

DISCOVER_TIMEOUT_S = 5.0  # learning what a cloud server can do (once) before handing a request to it
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


@dataclass(frozen=True)
class CloudTimeouts:
    """How long the cascade waits on a cloud stream (CascadeConfig's cloud_*_s)."""

    first_token_s: float | None = 15.0  # until the first token
    stall_s: float | None = 10.0  # between two tokens
    deadline_s: float | None = None  # the whole stream (the client's own call deadline)


class CloudTimedOut(Exception):
    """The cloud stream kept us waiting past one of CloudTimeouts' limits; `reason` names which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


async def _paced(stream: AsyncIterator[CloudTokenEvent], timeouts: CloudTimeouts) -> AsyncIterator[CloudTokenEvent]:
    """The stream's events, each awaited no longer than the first-token or stall limit; the stream
    is closed on the way out however it ends (a cancelled gRPC call aborts the request there)."""
    limit, reason = timeouts.first_token_s, "cloud_first_token_timeout"
    waiting: asyncio.Future | None = None
    try:
        while True:
            # asyncio.wait, not wait_for: a TimeoutError the client raises itself (its own deadline)
            # must stay the client's, not read as our limit.
            waiting = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({waiting}, timeout=limit)
            if not done:
                raise CloudTimedOut(reason)
            try:
                event = waiting.result()
            except StopAsyncIteration:
                return
            yield event
            limit, reason = timeouts.stall_s, "cloud_stall_timeout"
    finally:
        if waiting is not None and not waiting.done():  # timed out, or we were cancelled mid-wait
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        await stream.aclose()


def refusal_reason(client: CloudBackend | None, breaker: CircuitBreaker, cloud_ready: bool = True) -> str | None:
    """Why the cloud must not be called now, or None (then a half-open trial is ours: report it).
    `cloud_ready` False: an embedded cloud engine still loading (the local tier answers meanwhile)."""
    if not cloud_ready:  # first: an embedded tier still starting has no client yet
        return "cloud_loading"
    if client is None:
        return "no_cloud"
    if breaker.auth_disabled:
        return "cloud_auth"
    if not breaker.allow():
        return "circuit_open"
    return None


async def capability_refusal(
    runner, structured: StructuredOutput | None, continuing: bool, first_token_timeout_s: float, prompt=None
) -> str | None:
    """Why this cloud cannot take this request whatever its health (a tool grammar it cannot enforce, a
    continuation it cannot take, a raw prompt it cannot continue), or None. Only a request that needs such a
    capability asks the server what it is (an HTTP cloud: vLLM or not), and not while the breaker is open: a
    dead cloud must not cost every request a wait. `runner`: the sdk.cascade.runner.CascadeRunner; `prompt`:
    the request's sdk.cascade.prompt prompt (None: chat)."""
    cloud = runner.cloud
    grammar = structured is not None and structured.kind == "lark"
    raw = prompt is not None and prompt.is_raw
    token_ids = raw and prompt.token_ids is not None
    if (
        not (grammar or continuing or raw)
        or cloud is None
        or not runner.cloud_ready()
        or runner.breaker.state is BreakerState.OPEN
    ):
        return None
    if raw and not cloud.takes_raw_prompts:
        return "cloud_no_raw_prompts"  # an OpenAI-compatible cloud would read the text as a chat turn
    if grammar or continuing:
        with contextlib.suppress(CloudError):  # unreachable: the call itself fails, and the breaker counts it
            await cloud.discover(timeout_s=min(DISCOVER_TIMEOUT_S, first_token_timeout_s))
    if grammar and not cloud.takes_grammars:
        return "cloud_no_tools"  # a plain OpenAI-compatible cloud cannot take tandem's tool grammar
    if continuing and not (cloud.supports_continuation and (structured is None or cloud.continues_constrained)):
        return "cloud_cannot_continue"  # the local answer stands (a restart would repeat what streamed)
    if (continuing or token_ids) and await runner.vocabulary_verdict() is False:
        return "cloud_vocabulary_differs"  # the local token ids would mean other text there
    return None


async def stream_from_cloud(
    client: CloudBackend,
    breaker: CircuitBreaker,
    prompt: list[dict],
    params: SamplingParams,
    usage: CloudUsage,
    *,
    model: str,
    request_id: str,
    continuation_token_ids: Sequence[int],
    timeouts: CloudTimeouts,
    retry_backoff_s: float = RETRY_BACKOFF_S,
    drafted: DraftedAnswer | None = None,
) -> AsyncIterator[CloudTokenEvent]:
    """The cloud's tokens as they come; call only after refusal_reason() returned None.

    Timeouts match streaming (CloudTimeouts): the first token, each gap between tokens, and an
    optional whole-stream deadline, each with its own degraded reason; a timed-out call is
    closed, which cancels it on the server (its KV blocks are freed there).
    A call the cloud could not even take (UNAVAILABLE before its first token: a dropped
    connection, a server restarting) is retried once after `retry_backoff_s`: nothing has
    reached the client, so it is idempotent. Timeouts are not retried (the wait would
    double), nor is anything after the first token. `drafted`: the answer comes through it, the device
    drafting for the cloud (sdk.cascade.device_drafts)."""
    reported = False
    try:
        for attempt in range(2):
            started = False
            try:
                call = dict(
                    model=model,
                    request_id=request_id,
                    continuation_token_ids=continuation_token_ids,
                    timeout_s=timeouts.deadline_s,
                )
                if drafted is None:
                    stream = client.generate(prompt, params, **call)
                else:  # the device drafting for the cloud's answer (sdk.cascade.device_drafts)
                    stream = drafted.stream(client, prompt, params, **call)
                async for event in _paced(stream, timeouts):
                    started = True
                    # The cloud's own count wins when it gives one (an HTTP cloud may send fewer chunks than
                    # tokens, or a last chunk that is no token: counting events said 41 for llama-server's 40).
                    counted = event.num_output_tokens
                    usage.completion_tokens = counted if counted is not None else usage.completion_tokens + 1
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
    except CloudTimedOut as timeout:
        breaker.record_failure(FailureKind.DEADLINE)
        reported = True
        raise CloudFailed(timeout.reason) from timeout
    except CloudInvalidArgumentError:
        breaker.record_failure(FailureKind.INVALID_ARGUMENT)  # frees a half-open trial, counts nothing
        reported = True
        raise
    except CloudQuotaExceededError as error:
        # The cloud's budget for this tier's key is spent: the tier is healthy, so the breaker counts
        # nothing, and the request is answered locally.
        breaker.record_abandoned()
        reported = True
        raise CloudFailed(QUOTA_REASON) from error
    except CloudError as error:
        kind = classify_failure(error)
        if kind is FailureKind.UNAVAILABLE and started and client.spreads_over_replicas:
            # One replica of several went away mid-stream: the channel already sends the next call to
            # another, so this says nothing about the tier (calls that cannot start at all still count).
            breaker.record_abandoned()
        elif kind is FailureKind.AUTH:
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
