"""What each key (and each user within a key) has spent this UTC day and month, and what requests in
flight hold against it (reservations): one process's ledger. Spend is kept in memory for the
decisions (updated on the event loop as each request ends, so they are exact under concurrency),
and in SQLite so a restart keeps it (one writer thread; nothing is dropped). Reservations live in
memory only: a process that stops holds nothing.

Replicas that share one budget use sdk.budgets.postgres_ledger instead, which answers the same
calls (`Ledger`, the protocol both satisfy and the budget manager is typed by) from the state database.
Both keep the spend table declared in sdk.state.tables.budgets and read and write its rows by column name
(`Spend.from_row`, `Spend.to_row`).

    scope "key:<fingerprint>" or "user:<fingerprint>:<user>"; period "day:2026-11-25" or "month:2026-11"
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sdk.sqlite_writer import SQLiteWriter
from sdk.state.declaration import SQLITE, named_rows
from sdk.state.tables.budgets import SPEND

Pair = tuple[str, str]  # (scope, period), e.g. ("key:3f2a9c1d0b7e5a41", "day:2026-11-25")


@dataclass
class Spend:
    usd: float = 0.0
    cloud_tokens: int = 0
    total_tokens: int = 0
    requests: int = 0

    @property
    def cloud_share(self) -> float:
        return self.cloud_tokens / self.total_tokens if self.total_tokens else 0.0

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Spend:
        """From a spend row of either ledger, read by column name."""
        return cls(row["usd"], row["cloud_tokens"], row["total_tokens"], row["requests"])

    def to_row(self, pair: Pair) -> dict[str, Any]:
        """The spend row of `pair` (scope, period) holding this, by column name."""
        scope, period = pair
        return {
            "scope": scope,
            "period": period,
            "usd": self.usd,
            "cloud_tokens": self.cloud_tokens,
            "total_tokens": self.total_tokens,
            "requests": self.requests,
        }


@dataclass(frozen=True)
class Reservation:
    """USD held against every (scope, period) of a request's hard USD limits until it ends."""

    held: tuple[Pair, ...]
    usd: float
    id: int | None = None  # the state database's reservation (sdk.budgets.postgres_ledger)


@dataclass(frozen=True)
class Shortfall:
    """Why a reservation was refused: the check it failed (its index), what was spent and what others held."""

    index: int
    spent: float
    held: float


def periods(now: float) -> dict[str, str]:
    day = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).date()
    return {"day": f"day:{day.isoformat()}", "month": f"month:{day.strftime('%Y-%m')}"}


def key_scope(fingerprint: str | None) -> str:
    return f"key:{fingerprint or '-'}"


def user_scope(fingerprint: str | None, user: str) -> str:
    return f"user:{fingerprint or '-'}:{user}"


@runtime_checkable
class Ledger(Protocol):
    """What every spend ledger answers, and all the budget manager (sdk.budgets.manager) asks of one:
    SpendLedger here (one process's: memory, and SQLite behind it), PostgresSpendLedger (the state database
    replicas share: sdk.budgets.postgres_ledger)."""

    clock: Callable[[], float]  # wall-clock seconds: which day and month a spend falls in

    async def spends(self, pairs: list[Pair]) -> dict[Pair, Spend]:
        """What each (scope, period) has spent (nothing: an empty Spend)."""
        ...

    async def current(self, scope: str, period: str) -> Spend:
        """What `scope` has spent in the current `period` ("day" or "month")."""
        ...

    async def reserve(self, checks: list[tuple[Pair, float]], usd: float) -> Reservation | Shortfall:
        """Hold `usd` against each (pair, limit) unless spent + held + usd passes one of the limits."""
        ...

    def holds(self, reservation: Reservation | None) -> bool:
        """Whether a stream may go on spending against `reservation`."""
        ...

    def settle(
        self, reservation: Reservation | None, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int
    ) -> None:
        """A request has ended: release what it held and add what it cost (never blocks)."""
        ...

    def record(self, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int) -> None:
        """Add one request that held nothing (never blocks)."""
        ...

    async def held(self, pair: Pair) -> float: ...

    async def held_anywhere(self) -> float: ...

    async def settled(self) -> None:
        """Every settle made so far shows in what the decisions read."""
        ...

    @property
    def pending_settles(self) -> int:
        """Settles made here that have not landed yet (/metrics)."""
        ...

    @property
    def num_batches_replayed(self) -> int:
        """Settle batches sent again after they had landed, not applied twice (/metrics)."""
        ...

    async def aclose(self) -> None: ...


class SpendLedger:
    def __init__(self, path: str | os.PathLike, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.clock = clock
        self._spend: dict[Pair, Spend] = {}
        self._held: dict[Pair, float] = {}  # USD reserved by requests in flight
        self._writer = SQLiteWriter("spend", _add_spend)

    def start(self) -> SpendLedger:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, mode=0o700)
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in SPEND.ddl(SQLITE, if_not_exists=True):
            conn.execute(statement)
        current = set(periods(self.clock()).values())
        for row in named_rows(conn.execute(f"SELECT {SPEND.select_list()} FROM {SPEND.sqlite}")):
            if row["period"] in current:  # earlier periods stay in the file, not in memory
                self._spend[(row["scope"], row["period"])] = Spend.from_row(row)
        self._writer.start(conn)
        return self

    def spend(self, scope: str, period: str) -> Spend:
        """What `scope` has spent in the current `period` ("day" or "month")."""
        return self._spend.get((scope, periods(self.clock())[period]), Spend())

    async def current(self, scope: str, period: str) -> Spend:
        return self.spend(scope, period)

    async def spends(self, pairs: list[Pair]) -> dict[Pair, Spend]:
        return {pair: self._spend.get(pair, Spend()) for pair in pairs}

    async def reserve(self, checks: list[tuple[Pair, float]], usd: float) -> Reservation | Shortfall:
        """Hold `usd` against each (pair, limit) unless spent + held + usd passes one of the limits.
        All on the event loop, with no await between the checks and the hold: exact under concurrency."""
        for index, (pair, limit) in enumerate(checks):
            spent, held = self._spend.get(pair, Spend()).usd, self._held.get(pair, 0.0)
            if spent + held + usd > limit:
                return Shortfall(index, spent, held)
        pairs = tuple(pair for pair, _ in checks)
        for pair in pairs:
            self._held[pair] = self._held.get(pair, 0.0) + usd
        return Reservation(pairs, usd)

    def settle(
        self, reservation: Reservation | None, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int
    ) -> None:
        """A request has ended: release what it held and add what it cost (never blocks)."""
        if reservation is not None:
            for pair in reservation.held:
                left = self._held.get(pair, 0.0) - reservation.usd
                if left > 1e-12:
                    self._held[pair] = left
                else:
                    self._held.pop(pair, None)
        self.record(scopes, usd, cloud_tokens, total_tokens)

    # Settles change what the decisions read at once (the file is written behind): none pending, none replayed.
    pending_settles = 0
    num_batches_replayed = 0

    def holds(self, reservation: Reservation | None) -> bool:
        """Whether a stream may go on spending against `reservation`: always, in one process's memory (the
        shared ledger says no once its replica is fenced: sdk.budgets.postgres_ledger)."""
        return True

    async def held(self, pair: Pair) -> float:
        return self._held.get(pair, 0.0)

    async def held_anywhere(self) -> float:
        """USD held by every request in flight, over all pairs (0 when nothing is held)."""
        return sum(self._held.values())

    def record(self, scopes: list[str], usd: float, cloud_tokens: int, total_tokens: int) -> None:
        """Add one request to each scope's current day and month (event loop; never blocks)."""
        for scope in scopes:
            for period in periods(self.clock()).values():
                spend = self._spend.setdefault((scope, period), Spend())
                spend.usd += usd
                spend.cloud_tokens += cloud_tokens
                spend.total_tokens += total_tokens
                spend.requests += 1
                self._writer.put(Spend(usd, cloud_tokens, total_tokens, 1).to_row((scope, period)))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Everything recorded so far is in the file."""
        self._writer.flush(timeout_s)

    async def settled(self) -> None:
        """Every settle made so far shows in what the decisions read (here at once: they read memory)."""

    def close(self) -> None:
        self._writer.close(timeout_s=30)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


# A spend row added to what its (scope, period) holds.
_ADD_SPEND = (
    f"{SPEND.insert(SQLITE)} ON CONFLICT (scope, period) DO UPDATE SET "
    "usd = usd + excluded.usd, cloud_tokens = cloud_tokens + excluded.cloud_tokens, "
    "total_tokens = total_tokens + excluded.total_tokens, requests = requests + excluded.requests"
)


def _add_spend(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
    """One transaction adding each spend row (Spend.to_row: one request's) to its (scope, period)."""
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(_ADD_SPEND, rows)
    conn.execute("COMMIT")
