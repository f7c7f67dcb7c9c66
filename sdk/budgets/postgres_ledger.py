"""The spend ledger and the budget reservations in the state database the replicas share
(sdk.state): the calls of sdk.budgets.ledger.Ledger, answered for every replica at once, on the tables
declared in sdk.state.tables.budgets.

A reservation is one call of `tandem_reserve` (sdk.state.schema): under locks on its (scope,
period) pairs it reads what was spent and what live replicas hold, and holds this request's
largest cost unless that would pass a limit. A replica that dies holding reservations holds them
until its lease ends; then the next heartbeat of any replica deletes them.

Settling never waits and is never lost: a request's end adds its cost to the batch the database's
writer sends next (sdk.state.writes.Coalesced), one `tandem_settle_batch` call per batch, retried
until it lands and applied once however often it is sent (keyed by the batch's id). Until it has
landed, each reservation in it keeps holding its (larger) amount, so the bound can only be stricter
meanwhile; during an outage the batch grows by a few numbers per (scope, period), not a write per
request.

Fencing: once this replica cannot count on its lease (sdk.state.lease), it reserves nothing (503), and
`holds()` tells the streams of its reservations to stop at their next token, before the other replicas
delete those reservations. What such a stream spent before it stopped is settled when the database is
back: that, at most the reservations it held, is how far a period's spend can pass a limit when a replica
is cut off (docs/cloud-at-scale.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sdk.budgets.ledger import Pair, Reservation, Shortfall, Spend, periods
from sdk.state.database import StateDatabase
from sdk.state.tables.budgets import RESERVATIONS, SPEND
from sdk.state.tables.replicas import REPLICAS
from sdk.state.writes import Coalesced


@dataclass
class SettleBatch:
    """Settles gathered for one `tandem_settle_batch` call."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    num_settles: int = 0
    reservation_ids: list[int] = field(default_factory=list)
    held: set[Pair] = field(default_factory=set)  # the reservations' pairs (locked with the spend's)
    costs: dict[Pair, Spend] = field(default_factory=dict)  # what the batch adds, per (scope, period)

    def add(self, reservation: Reservation | None, pairs: list[Pair], usd: float, cloud: int, total: int) -> None:
        self.num_settles += 1
        if reservation is not None and reservation.id is not None:
            self.reservation_ids.append(reservation.id)
            self.held.update(reservation.held)
        for pair in pairs:
            spend = self.costs.setdefault(pair, Spend())
            spend.usd += usd
            spend.cloud_tokens += cloud
            spend.total_tokens += total
            spend.requests += 1

    def params(self, replica: str) -> tuple:
        held, pairs = sorted(self.held), sorted(self.costs)
        return (
            self.id,
            replica,
            self.reservation_ids,
            [scope for scope, _ in held],
            [period for _, period in held],
            [scope for scope, _ in pairs],
            [period for _, period in pairs],
            [self.costs[pair].usd for pair in pairs],
            [self.costs[pair].cloud_tokens for pair in pairs],
            [self.costs[pair].total_tokens for pair in pairs],
            [self.costs[pair].requests for pair in pairs],
        )


# What (scope, period) pairs have spent: SPEND's rows, read by column name (Spend.from_row) as the SQLite ledger's.
_SPENDS = (
    f"SELECT {SPEND.select_list()} FROM {SPEND.postgres} "
    "WHERE (scope, period) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
)
# USD that live replicas hold (a condition on the reservations `r` may follow).
_HELD = (
    f"SELECT coalesce(sum(r.usd), 0) FROM {RESERVATIONS.postgres} r JOIN {REPLICAS.postgres} p ON p.id = r.replica "
    "WHERE p.expires_at > now()"
)
SETTLE_BATCH = (
    "SELECT tandem_settle_batch(%s, %s, %s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[], "
    "%s::float8[], %s::bigint[], %s::bigint[], %s::bigint[])"
)


class PostgresSpendLedger:
    def __init__(self, db: StateDatabase, clock: Callable[[], float] = time.time):
        self.db = db
        self.clock = clock
        self.num_batches_replayed = 0  # batches sent again after they had landed (their reply lost): not re-applied
        self._settles = Coalesced(db.writes, SettleBatch, self._send)

    async def spends(self, pairs: list[Pair]) -> dict[Pair, Spend]:
        if not pairs:
            return {}
        rows = await self.db.call(
            _SPENDS, ([scope for scope, _ in pairs], [period for _, period in pairs]), by_name=True
        )
        found = {(row["scope"], row["period"]): Spend.from_row(row) for row in rows}
        return {pair: found.get(pair, Spend()) for pair in pairs}

    async def current(self, scope: str, period: str) -> Spend:
        pair = (scope, periods(self.clock())[period])
        return (await self.spends([pair]))[pair]

    async def reserve(self, checks: list[tuple[Pair, float]], usd: float) -> Reservation | Shortfall:
        """Hold `usd` against each (pair, limit). StateUnavailableError while this replica is fenced or its
        deferred writes are backed up, as while the database is away: budgeted work fails closed."""
        if not checks:
            return Reservation((), usd)
        if self.db.fenced or self.db.backed_up:
            raise self.db.unavailable()
        (outcome,) = await self.db.call(
            "SELECT reservation, failed, spent, held FROM tandem_reserve(%s, %s, %s, %s, %s)",
            (
                self.db.replica_id,
                [scope for (scope, _), _ in checks],
                [period for (_, period), _ in checks],
                [limit for _, limit in checks],
                usd,
            ),
            by_name=True,
        )
        if outcome["reservation"] is None:  # `failed` is the 1-based index of the limit it would break
            return Shortfall(outcome["failed"] - 1, outcome["spent"], outcome["held"])
        return Reservation(tuple(pair for pair, _ in checks), usd, outcome["reservation"])

    def holds(self, reservation: Reservation | None) -> bool:
        """Whether a stream may go on spending against `reservation`: False once this replica is fenced (its
        reservations may soon be deleted by the others), for a reservation held in the database."""
        return reservation is None or reservation.id is None or not self.db.fenced

    def settle(
        self, reservation: Reservation | None, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int
    ) -> None:
        """Release what the request held and add what it cost, in the next batch the writer sends."""
        pairs = [(scope, period) for scope in scopes for period in periods(self.clock()).values()]
        self._settles.add(lambda batch: batch.add(reservation, pairs, usd, cloud_tokens, total_tokens))

    def record(self, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int) -> None:
        self.settle(None, scopes, usd, cloud_tokens, total_tokens)

    async def _send(self, batch: SettleBatch) -> None:
        ((applied,),) = await self.db.call(SETTLE_BATCH, batch.params(self.db.replica_id))
        if not applied:
            self.num_batches_replayed += 1

    @property
    def pending_settles(self) -> int:
        """Settles made here that have not landed yet."""
        return sum(batch.num_settles for batch in self._settles.waiting)

    async def held(self, pair: Pair) -> float:
        """USD that live replicas hold against `pair` (the tests look)."""
        rows = await self.db.call(f"{_HELD} AND r.scope = %s AND r.period = %s", pair)
        return rows[0][0]

    async def held_anywhere(self) -> float:
        """USD live replicas hold over all pairs (0 when nothing is held)."""
        rows = await self.db.call(_HELD)
        return rows[0][0]

    async def settled(self, timeout_s: float = 30.0) -> None:
        """Every settle made so far shows in what the decisions read (the deferred writes have landed)."""
        await self.db.flush(timeout_s)

    async def aclose(self) -> None:
        """Settles still deferred are written by the database's own close (the server closes it last)."""
        await self.db.flush()
