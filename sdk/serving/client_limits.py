"""Per-client budgets of a serving process, shared by all its listeners (HTTP and gRPC).

- RequestRateLimiter: one token bucket per client (its API key, or its address without
  keys). A bucket holds up to `burst` tokens and refills at `per_minute / 60` tokens a
  second; each request takes one. An empty bucket says how long until the next token,
  which becomes HTTP's Retry-After or gRPC's `retry-after` trailing metadata.
- InFlightLimiter: at most `max_in_flight` requests being served per client at once.

`ClientLimits` bundles one process's limiters, so a key's budget is one budget whichever
listener its requests come through. What the gate asks of each limiter is a protocol (`RateLimit`,
`InFlightLimit`, `FailedKeyBackoff`) that the limiters here and their state database subclasses
(sdk.serving.shared_limits, on the tables of sdk.state.tables.limits) both satisfy. The clock is injectable so
tests need no sleeps.
Everything here is used from the one event loop both servers run on, so it takes no lock.
The decisions are coroutines because the replicas that share these limits through the state
database (sdk.serving.shared_limits) answer the same calls with a round trip; here they never wait.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

# Buckets of clients that went quiet are dropped once there are this many: keying by
# client IP must not let a scan of addresses grow memory without bound.
MAX_IDLE_BUCKETS = 10_000
DEFAULT_AUTH_BACKOFF_AFTER = 10  # failed keys from one address before it must wait
DEFAULT_AUTH_BACKOFF_MAX_S = 300.0  # the longest wait the doubling reaches


@runtime_checkable
class RateLimit(Protocol):
    """A token bucket per client: RequestRateLimiter, SharedRateLimiter."""

    per_minute: float  # what a refusal names
    burst: float
    refill_per_s: float

    async def acquire(self, client: str) -> float:
        """Take a token for `client`: 0.0 when allowed, else the seconds until one is available."""
        ...


@runtime_checkable
class InFlightLimit(Protocol):
    """Requests being served per client, `max_in_flight` at most each: InFlightLimiter, SharedInFlightLimiter."""

    max_in_flight: int

    async def try_acquire(self, client: str) -> bool: ...

    def release(self, client: str) -> None:
        """A request admitted by try_acquire has ended (never waits)."""
        ...

    def in_flight(self, client: str) -> int:
        """This process's requests in flight for `client`."""
        ...

    @property
    def total(self) -> int: ...


@runtime_checkable
class FailedKeyBackoff(Protocol):
    """The wait an address serves after failed keys: AuthFailureBackoff, SharedAuthFailureBackoff."""

    forget_after_s: float  # an address quiet this long starts afresh

    async def wait_s(self, address: str) -> float:
        """Seconds `address` must still wait before its next key is checked (0: check it now)."""
        ...

    async def failed(self, address: str) -> float:
        """Record a failed key from `address`; the wait it now starts (0: none yet)."""
        ...


@dataclass
class _Bucket:
    tokens: float
    updated_at: float


class RequestRateLimiter:
    """`per_minute` requests a minute per client, with bursts of up to `burst` requests."""

    def __init__(self, per_minute: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic):
        if not math.isfinite(per_minute) or per_minute <= 0:
            raise ValueError(f"rate_limit_per_minute must be a positive number, got {per_minute!r}")
        burst = per_minute if burst is None else burst
        if not math.isfinite(burst) or burst < 1:
            # A bucket that can never hold one whole token would refuse every request.
            raise ValueError(f"the rate-limit burst must be >= 1, got {burst!r}")
        self.per_minute = per_minute
        self.burst = float(burst)
        self.refill_per_s = per_minute / 60.0
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}

    async def acquire(self, client: str) -> float:
        return self.take(client)

    def take(self, client: str) -> float:
        """Take a token for `client`: 0.0 when allowed, else the seconds until one is available."""
        now = self.clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= MAX_IDLE_BUCKETS:
                self._drop_full_buckets(now)
            bucket = self._buckets[client] = _Bucket(self.burst, now)
        else:
            self._refill(bucket, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.refill_per_s

    def _refill(self, bucket: _Bucket, now: float) -> None:
        elapsed = max(0.0, now - bucket.updated_at)  # a clock that steps back must not drain a bucket
        bucket.tokens = min(self.burst, bucket.tokens + elapsed * self.refill_per_s)
        bucket.updated_at = now

    def _drop_full_buckets(self, now: float) -> None:
        """Forget clients whose bucket has refilled: a fresh bucket for them would be identical."""
        for client, bucket in list(self._buckets.items()):
            self._refill(bucket, now)
            if bucket.tokens >= self.burst:
                del self._buckets[client]


class InFlightLimiter:
    """Counts requests being served per client; `max_in_flight` at most each.

    A client's entry goes when its count returns to 0, so idle clients cost nothing.
    """

    def __init__(self, max_in_flight: int):
        if max_in_flight < 1:
            raise ValueError(f"max_concurrent_per_key must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._counts: dict[str, int] = {}

    async def try_acquire(self, client: str) -> bool:
        count = self._counts.get(client, 0)
        if count >= self.max_in_flight:
            return False
        self._counts[client] = count + 1
        return True

    def release(self, client: str) -> None:
        count = self._counts.get(client, 0) - 1
        if count > 0:
            self._counts[client] = count
        else:
            self._counts.pop(client, None)

    def in_flight(self, client: str) -> int:
        return self._counts.get(client, 0)

    @property
    def total(self) -> int:
        return sum(self._counts.values())


@dataclass
class ClientLimits:
    """One process's per-client budgets; None: that limit is off."""

    rate: RateLimit | None = None
    in_flight: InFlightLimit | None = None
    auth_backoff: FailedKeyBackoff | None = None  # applies where keys are configured
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    @classmethod
    def build(
        cls,
        rate_limit_per_minute: float | None = None,
        rate_limit_burst: float | None = None,
        max_concurrent_per_key: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        auth_backoff_after: int | None = DEFAULT_AUTH_BACKOFF_AFTER,
        auth_backoff_max_s: float = DEFAULT_AUTH_BACKOFF_MAX_S,
        *,
        kinds: tuple[type, type, type] | None = None,
    ) -> "ClientLimits":
        """The limits named by the servers' settings (rate_limit, its burst, max_concurrent_per_key,
        auth_backoff_after (None or 0: off), auth_backoff_max_s). `kinds`: the (rate, in-flight, backoff)
        limiter classes, or factories taking their arguments; this process's own by default
        (sdk.serving.shared_limits.shared_client_limits passes the state database's)."""
        if rate_limit_per_minute is None and rate_limit_burst is not None:
            raise ValueError("rate_limit_burst needs rate_limit_per_minute")
        make_rate, make_in_flight, make_backoff = kinds or (RequestRateLimiter, InFlightLimiter, AuthFailureBackoff)
        rate = None if rate_limit_per_minute is None else make_rate(rate_limit_per_minute, rate_limit_burst, clock)
        in_flight = None if max_concurrent_per_key is None else make_in_flight(max_concurrent_per_key)
        backoff = make_backoff(auth_backoff_after, auth_backoff_max_s, clock=clock) if auth_backoff_after else None
        return cls(rate, in_flight, backoff, clock)

    @property
    def active(self) -> bool:
        return self.rate is not None or self.in_flight is not None

    async def admit(self, address: str | None, client: str) -> Decision:
        """The limits of one request whose key (if any) matched, in the gate's order: the failed-key
        backoff of `address` (None: not asked, as without keys), then `client`'s token bucket, then
        its slot in flight; each only when the one before let the request through."""
        if address is not None and self.auth_backoff is not None:
            wait_s = await self.auth_backoff.wait_s(address)
            if wait_s > 0:
                return Decision(backoff_wait_s=wait_s)
        if self.rate is not None:
            wait_s = await self.rate.acquire(client)
            if wait_s > 0:
                return Decision(rate_wait_s=wait_s)
        if self.in_flight is None:
            return Decision()
        return Decision(entered=await self.in_flight.try_acquire(client))


@dataclass(frozen=True)
class Decision:
    """What ClientLimits.admit found: a backoff or rate-limit wait (seconds) that refuses the request, or
    whether it took a slot in flight (None: no in-flight limit, or it was refused before asking)."""

    backoff_wait_s: float = 0.0
    rate_wait_s: float = 0.0
    entered: bool | None = None


class AuthFailureBackoff:
    """Exponential backoff per client address after repeated failed authentication.

    After `after` failed key checks from one address, the address waits 1 s before its next
    key is checked, then 2 s after the next failure, 4 s, ... up to `max_wait_s`; while it
    waits, its requests are refused without their key being checked, so a guessing loop gets
    `after` tries and then about one per doubling wait. The failures of an address are
    forgotten once it has sent none for `forget_after_s`. A success does not reset them:
    otherwise a caller holding one valid key could interleave it to guess others at full speed.

    The trade-off: clients behind one NAT or proxy address share the count, so a guessing
    neighbour makes them wait too (behind a trusted proxy, the forwarded address counts).
    """

    def __init__(
        self,
        after: int = 10,
        max_wait_s: float = 300.0,
        forget_after_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if isinstance(after, bool) or not isinstance(after, int) or after < 1:
            raise ValueError(
                f"auth_backoff_after must be an integer >= 1 (failed keys before the backoff), got {after!r}"
            )
        if not math.isfinite(max_wait_s) or max_wait_s < 1:
            raise ValueError(f"auth_backoff_max_s must be >= 1 second, got {max_wait_s!r}")
        self.after = after
        self.max_wait_s = float(max_wait_s)
        self.forget_after_s = max(forget_after_s, 2 * self.max_wait_s)
        self.clock = clock
        self._failures: dict[str, tuple[int, float, float]] = {}  # address -> (count, last failure, blocked until)

    async def wait_s(self, address: str) -> float:
        """Seconds `address` must still wait before its next key is checked (0: check it now)."""
        entry = self._failures.get(address)
        if entry is None:
            return 0.0
        count, last, until = entry
        now = self.clock()
        if now - last >= self.forget_after_s:
            del self._failures[address]
            return 0.0
        return max(0.0, until - now)

    async def failed(self, address: str) -> float:
        """Record a failed key from `address`; returns the wait it now starts (0: none yet)."""
        now = self.clock()
        count, last, _ = self._failures.get(address, (0, now, now))
        if now - last >= self.forget_after_s:
            count = 0
        count += 1
        wait = 0.0 if count < self.after else min(self.max_wait_s, 2.0 ** (count - self.after))
        if len(self._failures) >= MAX_IDLE_BUCKETS and address not in self._failures:
            self._forget_quiet(now)
        self._failures[address] = (count, now, now + wait)
        return wait

    def _forget_quiet(self, now: float) -> None:
        for address, (_, last, until) in list(self._failures.items()):
            if now - last >= self.forget_after_s or until <= now:
                del self._failures[address]
