"""The per-client limits of sdk.serving.client_limits, kept in the state database so that the
replicas of a server share them (`state_db`): one token bucket per key across all replicas, one
count of requests in flight, one failed-key backoff per client address.

They satisfy the protocols of sdk.serving.client_limits (RateLimit, InFlightLimit, FailedKeyBackoff), on
the tables declared in sdk.state.tables.limits. Each decision is one statement or function call
(sdk.state.schema: `tandem_take_token`, `tandem_enter_slot`, `tandem_auth_failed`), atomic on its row;
an admitted request asks all three of
its limits in one call (`tandem_admit_slot`, SharedClientLimits.admit), so the gate costs one round
trip, bounded by the database's deadline (`state_db_timeout_s`). Returning an in-flight slot is
deferred to the database's writer (a response's end never waits on it), gathered with the others
waiting into one idempotent DELETE; a replica that dies with slots taken stops counting once its
lease ends.

Keys never reach the database: a client is stored as the SHA-256 of its identity (the key, or
`ip:<host>`).

While the database is unreachable, each replica falls back to its own in-memory limiter of the
same settings (what it does without `state_db`): requests keep being limited, per replica, and
nothing waits on the database. The fallback's counts start from zero and are dropped when it
comes back.
"""

from __future__ import annotations

import functools
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sdk.protocol.errors import StateUnavailableError
from sdk.serving.client_limits import AuthFailureBackoff, ClientLimits, Decision, InFlightLimiter, RequestRateLimiter
from sdk.state.database import StateDatabase
from sdk.state.tables.limits import IN_FLIGHT_REQUESTS
from sdk.state.tables.replicas import REPLICAS
from sdk.state.writes import Coalesced


def _digest(client: str) -> str:
    return hashlib.sha256(client.encode("utf-8")).hexdigest()


class SharedRateLimiter(RequestRateLimiter):
    """RequestRateLimiter's bucket per client, in the state database."""

    def __init__(
        self, db: StateDatabase, per_minute: float, burst: float | None = None, clock: Callable[[], float] = time.time
    ):
        super().__init__(per_minute, burst, clock)  # the same checks; its buckets are the fallback
        self.db = db

    async def acquire(self, client: str) -> float:
        try:
            rows = await self.db.call(
                "SELECT tandem_take_token(%s, %s, %s, %s)",
                (_digest(client), self.burst, self.refill_per_s, self.clock()),
            )
        except StateUnavailableError:
            return self.take(client)
        return rows[0][0]


class SharedInFlightLimiter(InFlightLimiter):
    """InFlightLimiter's count per client, summed over the live replicas: one row per request's slot
    (sdk.state.schema v5), so returning it is a DELETE that a retry repeats harmlessly."""

    def __init__(self, db: StateDatabase, max_in_flight: int):
        super().__init__(max_in_flight)
        self.db = db
        self._slots: dict[str, list[str]] = {}  # this replica's slots in the database, per client
        self._leaves = Coalesced(db.writes, list, self._send_leaves)  # slots to return, in one statement

    async def try_acquire(self, client: str) -> bool:
        slot = new_slot()
        try:
            rows = await self.db.call(
                "SELECT tandem_enter_slot(%s, %s, %s, %s)",
                (_digest(client), self.db.replica_id, slot, self.max_in_flight),
            )
        except StateUnavailableError:
            return await super().try_acquire(client)  # released there: release() finds no shared slot
        if rows[0][0]:
            self.count_shared(client, slot)
        return rows[0][0]

    def count_shared(self, client: str, slot: str) -> None:
        """This replica took `slot` for `client` in the database (release() gives one back there)."""
        self._slots.setdefault(client, []).append(slot)

    def release(self, client: str) -> None:
        slots = self._slots.get(client)
        if not slots:  # a slot the fallback counted
            super().release(client)
            return
        slot = slots.pop()  # a client's slots are alike: any one goes back
        if not slots:
            del self._slots[client]
        self._leaves.add(lambda batch: batch.append(slot))

    async def _send_leaves(self, slots: list[str]) -> None:
        await self.db.call(f"DELETE FROM {IN_FLIGHT_REQUESTS.postgres} WHERE slot = ANY(%s)", (slots,))

    def in_flight(self, client: str) -> int:
        """This replica's requests in flight for `client` (both books)."""
        return len(self._slots.get(client, ())) + super().in_flight(client)

    @property
    def total(self) -> int:
        return sum(len(slots) for slots in self._slots.values()) + super().total

    async def in_flight_everywhere(self, client: str) -> int:
        """Requests in flight for `client` on every live replica (the tests look)."""
        rows = await self.db.call(
            f"SELECT count(*) FROM {IN_FLIGHT_REQUESTS.postgres} f JOIN {REPLICAS.postgres} p ON p.id = f.replica "
            "WHERE f.client = %s AND p.expires_at > now()",
            (_digest(client),),
        )
        return rows[0][0]


def new_slot() -> str:
    return uuid.uuid4().hex


class SharedAuthFailureBackoff(AuthFailureBackoff):
    """AuthFailureBackoff's failures per client address, in the state database."""

    def __init__(
        self,
        db: StateDatabase,
        after: int = 10,
        max_wait_s: float = 300.0,
        forget_after_s: float = 900.0,
        clock: Callable[[], float] = time.time,
    ):
        super().__init__(after, max_wait_s, forget_after_s, clock)
        self.db = db

    async def wait_s(self, address: str) -> float:
        try:  # tandem_admit with only the address: the backoff rule written once, in the database
            rows = await self.db.call(
                "SELECT backoff_wait FROM tandem_admit(%s, %s, NULL, NULL, NULL, %s, NULL, NULL)",
                (address, self.forget_after_s, self.clock()),
            )
        except StateUnavailableError:
            return await super().wait_s(address)
        return rows[0][0]

    async def failed(self, address: str) -> float:
        try:
            rows = await self.db.call(
                "SELECT tandem_auth_failed(%s, %s, %s, %s, %s)",
                (address, self.clock(), self.after, self.max_wait_s, self.forget_after_s),
            )
        except StateUnavailableError:
            return await super().failed(address)
        return rows[0][0]


@dataclass
class SharedClientLimits(ClientLimits):
    """ClientLimits of the Shared* limiters above: an admitted request's three limits in one call."""

    db: StateDatabase | None = None

    async def admit(self, address: str | None, client: str) -> Decision:
        backoff = self.auth_backoff if address is not None else None
        rate, in_flight = self.rate, self.in_flight
        if self.db is None or (backoff is None and rate is None and in_flight is None):
            return await super().admit(address, client)
        slot = new_slot()
        try:
            (decided,) = await self.db.call(
                "SELECT backoff_wait, rate_wait, entered FROM tandem_admit_slot(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    None if backoff is None else address,
                    None if backoff is None else backoff.forget_after_s,
                    _digest(client),
                    None if rate is None else rate.burst,
                    None if rate is None else rate.refill_per_s,
                    self.clock(),
                    self.db.replica_id,
                    None if in_flight is None else in_flight.max_in_flight,
                    slot,
                ),
                by_name=True,
            )
        except StateUnavailableError:
            return await self._own_books(backoff, address, client)
        if decided["entered"]:
            in_flight.count_shared(client, slot)
        return Decision(decided["backoff_wait"], decided["rate_wait"], decided["entered"])

    async def _own_books(self, backoff, address: str | None, client: str) -> Decision:
        """The same decision from this replica's own counts (the database is away): the limiters' in-memory
        parents, as each Shared* limiter falls back to on its own."""
        if backoff is not None and (wait_s := await AuthFailureBackoff.wait_s(backoff, address)) > 0:
            return Decision(backoff_wait_s=wait_s)
        if self.rate is not None and (wait_s := RequestRateLimiter.take(self.rate, client)) > 0:
            return Decision(rate_wait_s=wait_s)
        if self.in_flight is None:
            return Decision()
        return Decision(entered=await InFlightLimiter.try_acquire(self.in_flight, client))


def shared_client_limits(
    db: StateDatabase,
    rate_limit_per_minute: float | None = None,
    rate_limit_burst: float | None = None,
    max_concurrent_per_key: int | None = None,
    auth_backoff_after: int | None = None,
    auth_backoff_max_s: float = 300.0,
    clock: Callable[[], float] = time.time,
) -> ClientLimits:
    """ClientLimits.build's limits, kept in the state database for every replica. On the wall clock:
    replicas' monotonic clocks do not compare."""
    kinds = (
        functools.partial(SharedRateLimiter, db),
        functools.partial(SharedInFlightLimiter, db),
        functools.partial(SharedAuthFailureBackoff, db),
    )
    limits = SharedClientLimits.build(
        rate_limit_per_minute,
        rate_limit_burst,
        max_concurrent_per_key,
        clock,
        auth_backoff_after,
        auth_backoff_max_s,
        kinds=kinds,
    )
    limits.db = db
    return limits
