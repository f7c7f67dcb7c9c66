"""What each key (and each user within a key) has spent this UTC day and month: in memory for
the decisions (updated on the event loop as each request ends, so they are exact under
concurrency), and in SQLite so a restart keeps them (one writer thread; nothing is dropped).

    scope "key:<fingerprint>" or "user:<fingerprint>:<user>"; period "day:2026-11-25" or "month:2026-11"
"""

from __future__ import annotations

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


@dataclass
class Spend:
    usd: float = 0.0
    cloud_tokens: int = 0
    total_tokens: int = 0
    requests: int = 0

    @property
    def cloud_share(self) -> float:
        return self.cloud_tokens / self.total_tokens if self.total_tokens else 0.0


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
        self._spend: dict[tuple[str, str], Spend] = {}
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
        return self._spend.get((scope, periods(self.clock())[period]), Spend())

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
        self._writer.flush(timeout_s)

    def close(self) -> None:
        self._writer.close(timeout_s=30)


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
