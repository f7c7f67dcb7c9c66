"""What each key (and each user within a key) has spent this UTC day and month, and what requests in
flight hold against it (reservations): one process's ledger. Spend is kept in memory for the
decisions (updated on the event loop as each request ends, so they are exact under concurrency),
and in SQLite so a restart keeps it (one writer thread; nothing is dropped). Reservations live in
memory only: a process that stops holds nothing.

Replicas that share one budget use sdk.budgets.postgres_ledger instead, which answers the same
calls from the state database.

    scope "key:<fingerprint>" or "user:<fingerprint>:<user>"; period "day:2026-11-25" or "month:2026-11"
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sdk.sqlite_writer import SQLiteWriter

SCHEMA = """
CREATE TABLE IF NOT EXISTS spend (
    scope TEXT NOT NULL, period TEXT NOT NULL,
    usd REAL NOT NULL, cloud_tokens INTEGER NOT NULL, total_tokens INTEGER NOT NULL, requests INTEGER NOT NULL,
    PRIMARY KEY (scope, period)
)
"""


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
        conn.execute(SCHEMA)
        current = set(periods(self.clock()).values())
        for scope, period, usd, cloud, total, requests in conn.execute("SELECT * FROM spend"):
            if period in current:  # earlier periods stay in the file, not in memory
                self._spend[(scope, period)] = Spend(usd, cloud, total, requests)
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
                self._writer.put((scope, period, usd, cloud_tokens, total_tokens))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Everything recorded so far is in the file."""
        self._writer.flush(timeout_s)

    async def settled(self) -> None:
        """Every settle made so far shows in what the decisions read (here at once: they read memory)."""

    def close(self) -> None:
        self._writer.close(timeout_s=30)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


def _add_spend(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    """One transaction adding each (scope, period, usd, cloud_tokens, total_tokens) row as one request."""
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO spend VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT (scope, period) DO UPDATE SET "
        "usd = usd + excluded.usd, cloud_tokens = cloud_tokens + excluded.cloud_tokens, "
        "total_tokens = total_tokens + excluded.total_tokens, requests = requests + 1",
        rows,
    )
    conn.execute("COMMIT")
