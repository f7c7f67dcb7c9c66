"""The token-bucket request limiter on a fake clock: bursts, refill, per-client buckets, bounded memory."""

from __future__ import annotations

import pytest

from sdk.serving import client_limits
from sdk.openai_server.errors import retry_after_header
from sdk.serving.client_limits import RequestRateLimiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_refill_at_the_per_minute_rate():
    clock = FakeClock()
    limiter = RequestRateLimiter(per_minute=60, burst=3, clock=clock)  # one token a second
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.acquire("a") == pytest.approx(1.0)
    clock.now += 0.5
    assert limiter.acquire("a") == pytest.approx(0.5)  # half a token back; a refusal takes nothing
    clock.now += 0.5
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("a") == pytest.approx(1.0)


def test_burst_defaults_to_the_per_minute_figure_and_waits_scale_with_the_rate():
    clock = FakeClock()
    limiter = RequestRateLimiter(per_minute=2, clock=clock)  # one token every 30 s
    assert limiter.acquire("a") == 0.0 and limiter.acquire("a") == 0.0
    assert limiter.acquire("a") == pytest.approx(30.0)
    clock.now += 3600  # a long pause refills only up to the burst
    assert [limiter.acquire("a") for _ in range(3)][-1] == pytest.approx(30.0)


def test_clients_have_their_own_buckets():
    limiter = RequestRateLimiter(per_minute=60, burst=1, clock=FakeClock())
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("a") > 0
    assert limiter.acquire("b") == 0.0


def test_a_clock_stepping_back_does_not_drain_or_fill_a_bucket():
    clock = FakeClock()
    limiter = RequestRateLimiter(per_minute=60, burst=1, clock=clock)
    limiter.acquire("a")
    clock.now -= 100
    assert limiter.acquire("a") == pytest.approx(1.0)


def test_idle_buckets_are_dropped_once_there_are_many(monkeypatch):
    monkeypatch.setattr(client_limits, "MAX_IDLE_BUCKETS", 3)
    clock = FakeClock()
    limiter = RequestRateLimiter(per_minute=60, burst=1, clock=clock)
    for client in ("a", "b", "c"):
        limiter.acquire(client)
    clock.now += 0.5
    limiter.acquire("d")  # nobody has refilled yet: all kept
    assert len(limiter._buckets) == 4
    clock.now += 1.0
    limiter.acquire("e")  # a, b, c, d are full again and forgotten
    assert set(limiter._buckets) == {"e"}


@pytest.mark.parametrize(
    "per_minute, burst", [(0, None), (-1, None), (float("inf"), None), (60, 0.5), (60, float("nan"))]
)
def test_limits_that_would_refuse_everything_or_nothing_are_rejected(per_minute, burst):
    with pytest.raises(ValueError):
        RequestRateLimiter(per_minute=per_minute, burst=burst)


@pytest.mark.parametrize("wait_s, header", [(0.0, "1"), (0.2, "1"), (1.0, "1"), (1.01, "2"), (29.5, "30")])
def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one(wait_s, header):
    assert retry_after_header(wait_s) == header


def test_auth_backoff_starts_after_n_failures_and_doubles_to_the_cap():
    clock = FakeClock()
    backoff = client_limits.AuthFailureBackoff(after=3, max_wait_s=8, clock=clock)
    assert [backoff.failed("a") for _ in range(2)] == [0.0, 0.0] and backoff.wait_s("a") == 0.0
    assert backoff.failed("a") == 1.0 and backoff.wait_s("a") == 1.0  # the 3rd failure starts the wait
    assert backoff.wait_s("b") == 0.0  # per address
    waits = []
    for _ in range(5):
        clock.now += backoff.wait_s("a")
        assert backoff.wait_s("a") == 0.0
        waits.append(backoff.failed("a"))
    assert waits == [2.0, 4.0, 8.0, 8.0, 8.0]


def test_auth_backoff_forgets_a_quiet_address_but_not_on_success():
    clock = FakeClock()
    backoff = client_limits.AuthFailureBackoff(after=2, max_wait_s=4, forget_after_s=60, clock=clock)
    backoff.failed("a"), backoff.failed("a")
    clock.now += 59  # still remembered (no success resets it: there is no such call)
    assert backoff.failed("a") == 2.0
    clock.now += 61
    assert backoff.wait_s("a") == 0.0 and backoff.failed("a") == 0.0  # a fresh count


@pytest.mark.parametrize("after, max_wait_s", [(0, 10), (True, 10), (3, 0.5), (3, float("inf"))])
def test_auth_backoff_refuses_bad_settings(after, max_wait_s):
    with pytest.raises(ValueError, match="auth_backoff"):
        client_limits.AuthFailureBackoff(after=after, max_wait_s=max_wait_s)
