"""Stored responses in a SQLite file of the process (sdk.response_store): the default.

One connection, used under a lock from worker threads (`asyncio.to_thread`), so the event loop
never waits on the disk. A put is written before the answer that names its id goes out (the
handler awaits it), so a `previous_response_id` sent right after finds it."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

from sdk.response_store.stored import SIZE_SLACK, MaintenanceClock, StoredResponse, StoreSettings

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    key_fingerprint TEXT,
    created_at REAL NOT NULL,
    bytes INTEGER NOT NULL,
    conversation TEXT NOT NULL,
    response TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_time ON responses (created_at);
"""

# The newest rows whose sizes add up to the target stay; the older ones go.
_TRIM = """
DELETE FROM responses WHERE id IN (
    SELECT id FROM (SELECT id, sum(bytes) OVER (ORDER BY created_at DESC, id) AS kept FROM responses) WHERE kept > ?
)
"""


class SQLiteResponseStore:
    def __init__(self, path: str | os.PathLike, settings: StoreSettings = StoreSettings(), clock=None):
        self.path = Path(path)
        self.where = str(self.path)
        self.settings = settings
        self.maintenance = clock or MaintenanceClock()
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))  # conversations: the owner only
        self._conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=10.0, check_same_thread=False)
        self._lock = threading.Lock()
        try:
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.executescript(_SCHEMA)
        except BaseException:
            self._conn.close()
            raise

    async def put(self, stored: StoredResponse) -> None:
        await asyncio.to_thread(self._put, stored)

    async def get(self, response_id: str, key: str | None) -> StoredResponse | None:
        return await asyncio.to_thread(self._get, response_id, key)

    async def delete(self, response_id: str, key: str | None) -> bool:
        return await asyncio.to_thread(self._delete, response_id, key)

    async def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _put(self, stored: StoredResponse) -> None:
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)", stored.columns())
            if self.maintenance.due():
                self._maintain()

    def _get(self, response_id: str, key: str | None) -> StoredResponse | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT id, key_fingerprint, created_at, conversation, response FROM responses "
                "WHERE id = ? AND key_fingerprint IS ? AND created_at >= ?",
                (response_id, key, self.settings.oldest_kept()),
            ).fetchone()
        return StoredResponse.of_row(row) if row else None

    def _delete(self, response_id: str, key: str | None) -> bool:
        with self._lock:
            cursor = self._conn.execute(
                "DELETE FROM responses WHERE id = ? AND key_fingerprint IS ?", (response_id, key)
            )
        return cursor.rowcount > 0

    def _maintain(self) -> None:
        """Retention, then size (under the lock)."""
        self._conn.execute("DELETE FROM responses WHERE created_at < ?", (self.settings.oldest_kept(),))
        total = self._conn.execute("SELECT coalesce(sum(bytes), 0) FROM responses").fetchone()[0]
        if total > self.settings.max_bytes:
            self._conn.execute(_TRIM, (int(self.settings.max_bytes * SIZE_SLACK),))

    async def stored_bytes(self) -> int:
        def read() -> int:
            with self._lock:
                return self._conn.execute("SELECT coalesce(sum(bytes), 0) FROM responses").fetchone()[0]

        return await asyncio.to_thread(read)
