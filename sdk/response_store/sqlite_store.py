"""Stored responses in a SQLite file of the process (sdk.response_store): the default.

One connection, used under a lock from worker threads (`asyncio.to_thread`), so the event loop
never waits on the disk. A put is written before the answer that names its id goes out (the
handler awaits it), so a `previous_response_id` sent right after finds it.

The bytes each key holds are kept beside the rows (`response_owners`, by triggers, so every delete
counts), so a put checks its key's share and the whole store's bound without adding up the table.
A put runs in one write transaction (BEGIN IMMEDIATE): two processes sharing the file (one data
directory) see each other's counts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from pathlib import Path

from sdk.response_store.stored import MaintenanceClock, StoredResponse, StoreSettings

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS responses (
        id TEXT PRIMARY KEY,
        key_fingerprint TEXT,
        created_at REAL NOT NULL,
        bytes INTEGER NOT NULL,
        conversation TEXT NOT NULL,
        response TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS responses_by_time ON responses (created_at)",
    "CREATE INDEX IF NOT EXISTS responses_by_owner ON responses (key_fingerprint, created_at)",
)

# The bytes each key's rows hold ('' for a server without keys), kept by the triggers below; made (and
# counted once) in a file that has none: a new one, or one an earlier version wrote.
_ADDED = """INSERT INTO response_owners VALUES (coalesce(NEW.key_fingerprint, ''), NEW.bytes)
        ON CONFLICT (owner) DO UPDATE SET bytes = bytes + excluded.bytes;"""
_GONE = "UPDATE response_owners SET bytes = bytes - OLD.bytes WHERE owner = coalesce(OLD.key_fingerprint, '');"
_OWNERS = (
    "CREATE TABLE response_owners (owner TEXT PRIMARY KEY, bytes INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO response_owners SELECT coalesce(key_fingerprint, ''), sum(bytes) FROM responses GROUP BY 1",
    f"CREATE TRIGGER responses_added AFTER INSERT ON responses BEGIN {_ADDED} END",
    f"CREATE TRIGGER responses_gone AFTER DELETE ON responses BEGIN {_GONE} END",
    f"CREATE TRIGGER responses_moved AFTER UPDATE OF key_fingerprint, bytes ON responses BEGIN {_GONE} {_ADDED} END",
)

# One key's newest rows (the one just put first) whose sizes add up to the room it has stay; its older ones go.
_TRIM_OWN = """
DELETE FROM responses WHERE id IN (
    SELECT id FROM (
        SELECT id, sum(bytes) OVER (ORDER BY id = ? DESC, created_at DESC, id DESC) AS kept
        FROM responses WHERE key_fingerprint IS ?
    ) WHERE kept > ?
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
            with _write(self._conn):
                for statement in _SCHEMA:
                    self._conn.execute(statement)
                exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'response_owners'"
                if self._conn.execute(exists).fetchone() is None:
                    for statement in _OWNERS:
                        self._conn.execute(statement)
        except BaseException:
            self._conn.close()
            raise

    async def put(self, stored: StoredResponse) -> bool:
        return await asyncio.to_thread(self._put, stored)

    async def get(self, response_id: str, key: str | None) -> StoredResponse | None:
        return await asyncio.to_thread(self._get, response_id, key)

    async def delete(self, response_id: str, key: str | None) -> bool:
        return await asyncio.to_thread(self._delete, response_id, key)

    async def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _put(self, stored: StoredResponse) -> bool:
        columns = stored.columns()
        size, owner = columns[3], stored.key_fingerprint
        if size > self.settings.max_row_bytes:
            return False
        with self._lock, _write(self._conn):
            if self.maintenance.due():
                self._expire()
            own, total = self._bytes(owner)
            excess = total + size - self.settings.max_bytes  # what must go for it to fit the whole store
            if excess > own:  # this key's older rows free too little: nothing goes, and it is not kept
                return False
            self._conn.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING", columns)
            room = min(self.settings.max_bytes_per_key, own + size - max(0, excess))
            if own + size > room:
                self._conn.execute(_TRIM_OWN, (stored.id, owner, room))
        return True

    def _bytes(self, owner: str | None) -> tuple[int, int]:
        """(the bytes this key's rows hold, the bytes all rows hold)."""
        own = self._conn.execute("SELECT bytes FROM response_owners WHERE owner = ?", (owner or "",)).fetchone()
        total = self._conn.execute("SELECT coalesce(sum(bytes), 0) FROM response_owners").fetchone()[0]
        return (own[0] if own else 0), total

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

    def _expire(self) -> None:
        """Retention (under the lock, in the put's transaction)."""
        self._conn.execute("DELETE FROM responses WHERE created_at < ?", (self.settings.oldest_kept(),))
        self._conn.execute("DELETE FROM response_owners WHERE bytes <= 0")

    async def stored_bytes(self, key: str | None = None, *, every_key: bool = True) -> int:
        """The bytes all rows hold; with `every_key=False`, the bytes of `key`'s rows."""

        def read() -> int:
            with self._lock:
                own, total = self._bytes(key)
                return total if every_key else own

        return await asyncio.to_thread(read)


@contextlib.contextmanager
def _write(conn: sqlite3.Connection):
    """A write transaction on an autocommit connection: BEGIN IMMEDIATE, so another process's puts wait for it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
