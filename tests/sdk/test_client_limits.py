"""The per-client limits on a fake clock: the token-bucket rate limit (bursts, refill, per-client
buckets, bounded memory), requests in flight, the failed-key backoff. The decisions run against both
books: this process's memory and the state database replicas share (sdk.serving.shared_limits)."""

from __future__ import annotations

import pytest

from sdk.serving import client_limits
from sdk.openai_server.errors import retry_after_header
from sdk.serving.client_limits import InFlightLimiter, RequestRateLimiter


class FakeClock:
    def __init__(self) -> None:
        # Wall-clock seconds ahead of now: the state database's housekeeping deletes buckets full by now.
        self.now = 4_000_000_000.0

    def __call__(self) -> float:
        return self.now


class Books:
    """The limiters of one kind of book: "local" (this process) or "postgres" (the state database); each
    answers the protocol the access gate asks it by (RateLimit, FailedKeyBackoff, InFlightLimit)."""

    def __init__(self, db=None):
        self.db = db

    def rate(self, per_minute, burst=None, clock=None):
        if self.db is None:
            return _checked(
                RequestRateLimiter(per_minute=per_minute, burst=burst, clock=clock), client_limits.RateLimit
            )
        from sdk.serving.shared_limits import SharedRateLimiter

        return _checked(SharedRateLimiter(self.db, per_minute, burst, clock), client_limits.RateLimit)

    def backoff(self, **settings):
        if self.db is None:
            return _checked(client_limits.AuthFailureBackoff(**settings), client_limits.FailedKeyBackoff)
        from sdk.serving.shared_limits import SharedAuthFailureBackoff

        return _checked(SharedAuthFailureBackoff(self.db, **settings), client_limits.FailedKeyBackoff)

    def in_flight(self, max_in_flight):
        if self.db is None:
            return _checked(InFlightLimiter(max_in_flight), client_limits.InFlightLimit)
        from sdk.serving.shared_limits import SharedInFlightLimiter

        return _checked(SharedInFlightLimiter(self.db, max_in_flight), client_limits.InFlightLimit)


def _checked(limiter, protocol):
    assert isinstance(limiter, protocol), f"{type(limiter).__name__} does not answer {protocol.__name__}"
    return limiter


@pytest.fixture(params=["local", "postgres"])
def books(request):
    return Books(request.getfixturevalue("state_db") if request.param == "postgres" else None)


async def test_burst_then_refill_at_the_per_minute_rate(books):
    clock = FakeClock()
    limiter = books.rate(60, 3, clock)  # one token a second
    assert [(await limiter.acquire("a")) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert (await limiter.acquire("a")) == pytest.approx(1.0)
    clock.now += 0.5
    assert (await limiter.acquire("a")) == pytest.approx(0.5)  # half a token back; a refusal takes nothing
    clock.now += 0.5
    assert (await limiter.acquire("a")) == 0.0
    assert (await limiter.acquire("a")) == pytest.approx(1.0)


async def test_burst_defaults_to_the_per_minute_figure_and_waits_scale_with_the_rate(books):
    clock = FakeClock()
    limiter = books.rate(2, clock=clock)  # one token every 30 s
    assert (await limiter.acquire("a")) == 0.0 and (await limiter.acquire("a")) == 0.0
    assert (await limiter.acquire("a")) == pytest.approx(30.0)
    clock.now += 3600  # a long pause refills only up to the burst
    assert [(await limiter.acquire("a")) for _ in range(3)][-1] == pytest.approx(30.0)


async def test_clients_have_their_own_buckets(books):
    limiter = books.rate(60, 1, FakeClock())
    assert (await limiter.acquire("a")) == 0.0
    assert (await limiter.acquire("a")) > 0
    assert (await limiter.acquire("b")) == 0.0


async def test_a_clock_stepping_back_does_not_drain_or_fill_a_bucket(books):
    clock = FakeClock()
    limiter = books.rate(60, 1, clock)
    await limiter.acquire("a")
    clock.now -= 100
    assert (await limiter.acquire("a")) == pytest.approx(1.0)


def test_idle_buckets_are_dropped_once_there_are_many(monkeypatch):
    monkeypatch.setattr(client_limits, "MAX_IDLE_BUCKETS", 3)
    clock = FakeClock()
    limiter = RequestRateLimiter(per_minute=60, burst=1, clock=clock)
    for client in ("a", "b", "c"):
        limiter.take(client)
    clock.now += 0.5
    limiter.take("d")  # nobody has refilled yet: all kept
    assert len(limiter._buckets) == 4
    clock.now += 1.0
    limiter.take("e")  # a, b, c, d are full again and forgotten
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


async def test_auth_backoff_starts_after_n_failures_and_doubles_to_the_cap(books):
    clock = FakeClock()
    backoff = books.backoff(after=3, max_wait_s=8, clock=clock)
    assert [(await backoff.failed("a")) for _ in range(2)] == [0.0, 0.0] and (await backoff.wait_s("a")) == 0.0
    assert (await backoff.failed("a")) == 1.0 and (await backoff.wait_s("a")) == 1.0  # the 3rd failure starts the wait
    assert (await backoff.wait_s("b")) == 0.0  # per address
    waits = []
    for _ in range(5):
        clock.now += await backoff.wait_s("a")
        assert (await backoff.wait_s("a")) == 0.0
        waits.append((await backoff.failed("a")))
    assert waits == [2.0, 4.0, 8.0, 8.0, 8.0]


async def test_auth_backoff_forgets_a_quiet_address_but_not_on_success(books):
    clock = FakeClock()
    backoff = books.backoff(after=2, max_wait_s=4, forget_after_s=60, clock=clock)
    (await backoff.failed("a")), (await backoff.failed("a"))
    clock.now += 59  # still remembered (no success resets it: there is no such call)
    assert (await backoff.failed("a")) == 2.0
    clock.now += 61
    assert (await backoff.wait_s("a")) == 0.0 and (await backoff.failed("a")) == 0.0  # a fresh count


@pytest.mark.parametrize("after, max_wait_s", [(0, 10), (True, 10), (3, 0.5), (3, float("inf"))])
def test_auth_backoff_refuses_bad_settings(after, max_wait_s):
    with pytest.raises(ValueError, match="auth_backoff"):
        client_limits.AuthFailureBackoff(after=after, max_wait_s=max_wait_s)


async def test_requests_in_flight_per_client_up_to_the_limit(books):
    limiter = books.in_flight(2)
    assert [await limiter.try_acquire("a") for _ in range(3)] == [True, True, False]
    assert await limiter.try_acquire("b")  # per client
    limiter.release("a")
    if books.db is not None:
        await books.db.flush()  # a release is written after the response has ended
    assert await limiter.try_acquire("a") and not await limiter.try_acquire("a")
    assert limiter.in_flight("a") == 2 and limiter.total == 3


async def test_one_admission_asks_the_backoff_then_the_bucket_then_the_slot(books):
    """ClientLimits.admit (one round trip where the replicas share the books): each limit is asked only
    when the one before let the request through, so a refused request spends nothing further."""
    clock = FakeClock()
    if books.db is None:
        limits = client_limits.ClientLimits.build(60, 2, 1, clock, auth_backoff_after=1, auth_backoff_max_s=8)
    else:
        from sdk.serving.shared_limits import shared_client_limits

        limits = shared_client_limits(books.db, 60, 2, 1, auth_backoff_after=1, auth_backoff_max_s=8, clock=clock)
    first = await limits.admit("10.0.0.1", "key-a")
    assert first == client_limits.Decision(entered=True) and limits.in_flight.in_flight("key-a") == 1
    busy = await limits.admit("10.0.0.1", "key-a")  # a token taken (1 left), then no slot
    assert busy.entered is False and busy.rate_wait_s == 0
    assert await limits.auth_backoff.failed("10.0.0.1") == 1.0  # a wrong key from the same address
    backing_off = await limits.admit("10.0.0.1", "key-a")
    assert backing_off.backoff_wait_s == 1.0 and backing_off.entered is None
    clock.now += 1.0  # the backoff is over, and the bucket has one more token (2 by now)
    limits.in_flight.release("key-a")
    if books.db is not None:
        await books.db.flush()
    assert (await limits.admit("10.0.0.1", "key-a")).entered is True  # the backoff took no token
    limits.in_flight.release("key-a")
    if books.db is not None:
        await books.db.flush()
    clock.now += 1.0  # one more token
    assert (await limits.admit(None, "key-a")).entered is True  # no address: no backoff asked
    empty = await limits.admit(None, "key-a")
    assert empty.rate_wait_s == pytest.approx(1.0) and empty.entered is None
