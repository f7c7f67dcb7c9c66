"""Per-client request-rate limits: one token bucket per API key (or per client IP).

A bucket holds up to `burst` tokens and refills at `per_minute / 60` tokens a
second; each request takes one. An empty bucket says how long until the next token,
which becomes the 429's Retry-After. The clock is injectable so tests need no sleeps.
The limiter is used from the event loop only, so it takes no lock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

# Buckets of clients that went quiet are dropped once there are this many: keying by
# client IP must not let a scan of addresses grow memory without bound.
MAX_IDLE_BUCKETS = 10_000


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

    def acquire(self, client: str) -> float:
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

