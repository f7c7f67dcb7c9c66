"""The spend ledger and the budget reservations in the state database the replicas share
(sdk.state): the calls of sdk.budgets.ledger.SpendLedger, answered for every replica at once.

A reservation is one call of `tandem_reserve` (sdk.state.schema): under locks on its (scope,
period) pairs it reads what was spent and what live replicas hold, and holds this request's
largest cost unless that would pass a limit. Settling is one call of `tandem_settle`, deferred to
the database's writer (sdk.state.database) so that a request's end never waits on the network:
until it has run, the reservation keeps holding its (larger) amount, so the bound can only be
stricter for that moment. A replica that dies holding reservations holds them until its lease
ends; then the next heartbeat of any replica deletes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sdk.budgets.ledger import Pair, Reservation, Shortfall, Spend, periods
from sdk.state.database import StateDatabase


class PostgresSpendLedger:
    def __init__(self, db: StateDatabase, clock: Callable[[], float] = time.time):
        self.db = db
        self.clock = clock

    async def spends(self, pairs: list[Pair]) -> dict[Pair, Spend]:
        if not pairs:
            return {}
        rows = await self.db.call(
            "SELECT scope, period, usd, cloud_tokens, total_tokens, requests FROM tandem_spend "
            "WHERE (scope, period) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([scope for scope, _ in pairs], [period for _, period in pairs]),
        )
        found = {
            (scope, period): Spend(usd, cloud, total, requests) for scope, period, usd, cloud, total, requests in rows
        }
        return {pair: found.get(pair, Spend()) for pair in pairs}

    async def current(self, scope: str, period: str) -> Spend:
        pair = (scope, periods(self.clock())[period])
        return (await self.spends([pair]))[pair]

    async def reserve(self, checks: list[tuple[Pair, float]], usd: float) -> Reservation | Shortfall:
        if not checks:
            return Reservation((), usd)
        ((reservation, failed, spent, held),) = await self.db.call(
            "SELECT * FROM tandem_reserve(%s, %s, %s, %s, %s)",
            (
                self.db.replica_id,
                [scope for (scope, _), _ in checks],
                [period for (_, period), _ in checks],
                [limit for _, limit in checks],
                usd,
            ),
        )
        if reservation is None:
            return Shortfall(failed - 1, spent, held)
        return Reservation(tuple(pair for pair, _ in checks), usd, reservation)

    def settle(
        self, reservation: Reservation | None, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int
    ) -> None:
        """Release what the request held and add what it cost, as soon as the database takes it."""
        pairs = [(scope, period) for scope in scopes for period in periods(self.clock()).values()]
        held = reservation.held if reservation is not None else ()
        params = (
            reservation.id if reservation is not None else None,
            [scope for scope, _ in held],
            [period for _, period in held],
            [scope for scope, _ in pairs],
            [period for _, period in pairs],
            usd,
            cloud_tokens,
            total_tokens,
        )

        async def write() -> None:
            await self.db.call("SELECT tandem_settle(%s, %s::text[], %s::text[], %s, %s, %s, %s, %s)", params)

        self.db.defer(write)

    def record(self, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int) -> None:
        self.settle(None, scopes, usd, cloud_tokens, total_tokens)

    async def held(self, pair: Pair) -> float:
        """USD that live replicas hold against `pair` (the tests look)."""
        rows = await self.db.call(
            "SELECT coalesce(sum(r.usd), 0) FROM tandem_reservations r JOIN tandem_replicas p ON p.id = r.replica "
            "WHERE r.scope = %s AND r.period = %s AND p.expires_at > now()",
            pair,
        )
        return rows[0][0]

    async def held_anywhere(self) -> float:
        """USD live replicas hold over all pairs (0 when nothing is held)."""
        rows = await self.db.call(
            "SELECT coalesce(sum(r.usd), 0) FROM tandem_reservations r JOIN tandem_replicas p ON p.id = r.replica "
            "WHERE p.expires_at > now()"
        )
        return rows[0][0]

    async def settled(self, timeout_s: float = 30.0) -> None:
        """Every settle made so far shows in what the decisions read (the deferred writes have run)."""
        await self.db.flush(timeout_s)

    async def aclose(self) -> None:
        """Settles still deferred are written by the database's own close (the server closes it last)."""
        await self.db.flush()
