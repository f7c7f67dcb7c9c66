"""Circuit breaker transitions on a fake clock, auth disabling, failure classification,
and retries with backoff on a fake sleep."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sdk.protocol.cloud_backend import CloudStatus
from router.circuit_breaker import BreakerState, CircuitBreaker, CircuitOpenError
from router.retry import retry_with_backoff
from router.failure_kinds import FailureKind, classify_failure


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeSleep:
    def __init__(self):
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


class FakeStatusCode:
    """Stands in for grpc.StatusCode: classification reads only `.name`."""

    def __init__(self, name: str):
        self.name = name


class FakeCloudError(Exception):
    def __init__(self, code_name: str):
        super().__init__(code_name)
        self.code = FakeStatusCode(code_name)


class HttpError(Exception):
    def __init__(self, status_code: int):
        super().__init__(status_code)
        self.status_code = status_code


def make_breaker(threshold: int = 3, cool_down_s: float = 30.0) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(failure_threshold=threshold, cool_down_s=cool_down_s, clock=clock), clock


def test_opens_after_consecutive_failures_and_half_opens_after_cool_down():
    breaker, clock = make_breaker()
    breaker.record_failure(FailureKind.UNAVAILABLE)
    breaker.record_success()  # resets the count: failures must be consecutive
    for _ in range(2):
        breaker.record_failure(FailureKind.DEADLINE)
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    breaker.record_failure(FailureKind.UNAVAILABLE)
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now += 29.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the one trial call
    assert not breaker.allow()  # everyone else waits for its outcome
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.num_consecutive_failures == 0


def test_failed_trial_reopens_for_a_full_cool_down():
    breaker, clock = make_breaker(threshold=2, cool_down_s=10)
    breaker.record_failure(FailureKind.OVERLOADED)
    breaker.record_failure(FailureKind.INTERNAL)
    clock.now += 10
    assert breaker.allow()
    breaker.record_failure(FailureKind.UNAVAILABLE)
    assert breaker.state is BreakerState.OPEN
    clock.now += 9
    assert not breaker.allow()
    clock.now += 1
    assert breaker.allow()


def test_invalid_argument_neither_counts_nor_blocks_the_trial():
    breaker, clock = make_breaker(threshold=1, cool_down_s=5)
    for _ in range(5):
        breaker.record_failure(FailureKind.INVALID_ARGUMENT)
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure(FailureKind.UNAVAILABLE)
    clock.now += 5
    assert breaker.allow()
    breaker.record_failure(FailureKind.INVALID_ARGUMENT)  # the trial showed nothing
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allow()


def test_auth_failure_disables_until_reset_and_logs_once(caplog):
    breaker, clock = make_breaker()
    with caplog.at_level(logging.WARNING, logger="tandem.router"):
        breaker.record_auth_failure(401)
        breaker.record_failure(FailureKind.AUTH)
        breaker.record_auth_failure(403)
    assert breaker.auth_disabled and breaker.state is BreakerState.AUTH_DISABLED
    (record,) = caplog.records
    assert "escalation disabled" in record.getMessage() and "401" in record.getMessage()
    clock.now += 1e6
    breaker.record_success()  # neither time nor a stray success re-enables it
    assert not breaker.allow()
    breaker.reset()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()


def test_invalid_settings_raise():
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ValueError, match="cool_down_s"):
        CircuitBreaker(cool_down_s=-1)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (FakeCloudError("UNAVAILABLE"), FailureKind.UNAVAILABLE),
        (FakeCloudError("DEADLINE_EXCEEDED"), FailureKind.DEADLINE),
        (FakeCloudError("RESOURCE_EXHAUSTED"), FailureKind.OVERLOADED),
        (FakeCloudError("UNAUTHENTICATED"), FailureKind.AUTH),
        (FakeCloudError("PERMISSION_DENIED"), FailureKind.AUTH),
        (FakeCloudError("INVALID_ARGUMENT"), FailureKind.INVALID_ARGUMENT),
        (FakeCloudError("DATA_LOSS"), FailureKind.INTERNAL),
        (HttpError(401), FailureKind.AUTH),
        (HttpError(403), FailureKind.AUTH),
        (HttpError(400), FailureKind.INVALID_ARGUMENT),
        (HttpError(503), FailureKind.UNAVAILABLE),
        (HttpError(504), FailureKind.DEADLINE),
        (HttpError(500), FailureKind.INTERNAL),
        (asyncio.TimeoutError(), FailureKind.DEADLINE),
        (ConnectionRefusedError(), FailureKind.UNAVAILABLE),
        (RuntimeError("bug"), FailureKind.INTERNAL),
    ],
)
def test_classify_failure(error, kind):
    assert classify_failure(error) is kind


def test_classify_failure_reads_the_sdk_cloud_errors():
    from sdk.cloud.grpc_client import CloudUnauthenticatedError, CloudUnavailableError

    assert classify_failure(CloudUnavailableError("down", CloudStatus.UNAVAILABLE)) is FailureKind.UNAVAILABLE
    assert classify_failure(CloudUnauthenticatedError("no", CloudStatus.UNAUTHENTICATED)) is FailureKind.AUTH


def failing_then_ok(errors: list[Exception], result: str = "ok"):
    calls = []

    async def call():
        calls.append(len(calls))
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return call, calls


async def test_retries_idempotent_retryable_failures_with_capped_backoff():
    sleep = FakeSleep()
    call, calls = failing_then_ok([FakeCloudError("UNAVAILABLE")] * 3 + [TimeoutError()])
    result = await retry_with_backoff(call, attempts=5, base_s=0.1, max_s=0.3, idempotent=True, sleep=sleep)
    assert result == "ok" and len(calls) == 5
    assert sleep.delays == pytest.approx([0.1, 0.2, 0.3, 0.3])


async def test_gives_up_after_attempts_with_the_last_error():
    sleep = FakeSleep()
    call, calls = failing_then_ok([FakeCloudError("UNAVAILABLE")] * 5)
    with pytest.raises(FakeCloudError):
        await retry_with_backoff(call, attempts=3, base_s=1, max_s=10, idempotent=True, sleep=sleep)
    assert len(calls) == 3 and sleep.delays == [1, 2]


async def test_no_retry_when_not_idempotent():
    sleep = FakeSleep()
    call, calls = failing_then_ok([FakeCloudError("UNAVAILABLE")])
    with pytest.raises(FakeCloudError):
        await retry_with_backoff(call, attempts=3, base_s=1, max_s=1, idempotent=False, sleep=sleep)
    assert len(calls) == 1 and sleep.delays == []


NON_RETRYABLE_CODES = ["INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED"]


@pytest.mark.parametrize("code", NON_RETRYABLE_CODES)
async def test_no_retry_for_non_retryable_kinds(code):
    sleep = FakeSleep()
    call, calls = failing_then_ok([FakeCloudError(code)])
    with pytest.raises(FakeCloudError):
        await retry_with_backoff(call, attempts=3, base_s=1, max_s=1, idempotent=True, sleep=sleep)
    assert len(calls) == 1 and sleep.delays == []


async def test_retry_reports_to_the_breaker_and_stops_when_it_opens():
    breaker, _ = make_breaker(threshold=2)
    sleep = FakeSleep()
    call, calls = failing_then_ok([FakeCloudError("UNAVAILABLE")] * 5)
    with pytest.raises(FakeCloudError):
        await retry_with_backoff(call, attempts=5, base_s=1, max_s=1, idempotent=True, sleep=sleep, breaker=breaker)
    assert len(calls) == 2 and breaker.state is BreakerState.OPEN
    with pytest.raises(CircuitOpenError, match="open"):
        await retry_with_backoff(call, idempotent=True, sleep=sleep, breaker=breaker)
    assert len(calls) == 2


async def test_retry_disables_the_breaker_on_auth_failure():
    breaker, _ = make_breaker()
    call, _ = failing_then_ok([HttpError(403)])
    with pytest.raises(HttpError):
        await retry_with_backoff(call, idempotent=True, sleep=FakeSleep(), breaker=breaker)
    assert breaker.auth_disabled


async def test_success_closes_a_half_open_breaker():
    breaker, clock = make_breaker(threshold=1, cool_down_s=1)
    breaker.record_failure(FailureKind.UNAVAILABLE)
    clock.now += 1
    call, _ = failing_then_ok([])
    assert await retry_with_backoff(call, breaker=breaker) == "ok"
    assert breaker.state is BreakerState.CLOSED


async def test_invalid_retry_settings_raise():
    call, _ = failing_then_ok([])
    with pytest.raises(ValueError, match="attempts"):
        await retry_with_backoff(call, attempts=0)
    with pytest.raises(ValueError, match="base_s"):
        await retry_with_backoff(call, base_s=2, max_s=1)


def test_abandoned_or_lost_trials_do_not_wedge_half_open():
    breaker, clock = make_breaker(threshold=1, cool_down_s=10)
    breaker.record_failure(FailureKind.UNAVAILABLE)
    clock.now += 10
    assert breaker.allow()
    breaker.record_abandoned()  # the trial was cancelled
    assert breaker.allow()  # a new trial; its caller never reports back
    clock.now += 9.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN


async def test_cancelled_trial_call_frees_the_trial():
    breaker, clock = make_breaker(threshold=1, cool_down_s=1)
    breaker.record_failure(FailureKind.UNAVAILABLE)
    clock.now += 1
    started = asyncio.Event()

    async def hangs():
        started.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(retry_with_backoff(hangs, breaker=breaker))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.allow()
