"""Stored responses in a SQLite file of the process (sdk.response_store): the default.

One connection, used under a lock from worker threads (`asyncio.to_thread`), so the event loop
never waits on the disk. A put is written before the answer that names its id goes out (the
handler awaits it), so a `previous_response_id` sent right after finds it.

The bytes each key holds are kept beside the rows (`response_owners`, by triggers, so every delete
counts), so a put checks its key's share and the whole store's bound without adding up the table.
A put runs in one write transaction (BEGIN IMMEDIATE): two processes sharing the file (one data
directory) see each other's counts. The tables are declared in sdk.state.tables.responses, the statements
shared with the state database's store in sdk.response_store.statements."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from pathlib import Path

from sdk.response_store.statements import IN_SQLITE as SQL
from sdk.response_store.stored import MaintenanceClock, StoredResponse, StoreSettings
from sdk.state.declaration import SQLITE, named_row
from sdk.state.tables.responses import RESPONSE_OWNERS, RESPONSES

_RESPONSES, _OWNERS_TABLE = RESPONSES.sqlite, RESPONSE_OWNERS.sqlite
_PUT = f"{RESPONSES.insert(SQLITE)} ON CONFLICT (id) DO NOTHING"

# The bytes each key's rows hold ('' for a server without keys), kept by the triggers below; made (and
# counted once) in a file that has none: a new one, or one an earlier version wrote.
_ADDED = f"""INSERT INTO {_OWNERS_TABLE} (owner, bytes) VALUES (coalesce(NEW.key_fingerprint, ''), NEW.bytes)
        ON CONFLICT (owner) DO UPDATE SET bytes = bytes + excluded.bytes;"""
_GONE = f"UPDATE {_OWNERS_TABLE} SET bytes = bytes - OLD.bytes WHERE owner = coalesce(OLD.key_fingerprint, '');"
_OWNERS = (
    *RESPONSE_OWNERS.ddl(SQLITE),
    (
        f"INSERT INTO {_OWNERS_TABLE} (owner, bytes) "
        f"SELECT coalesce(key_fingerprint, ''), sum(bytes) FROM {_RESPONSES} GROUP BY 1"
    ),
    f"CREATE TRIGGER responses_added AFTER INSERT ON {_RESPONSES} BEGIN {_ADDED} END",
    f"CREATE TRIGGER responses_gone AFTER DELETE ON {_RESPONSES} BEGIN {_GONE} END",
    f"CREATE TRIGGER responses_moved AFTER UPDATE OF key_fingerprint, bytes ON {_RESPONSES} BEGIN {_GONE} {_ADDED} END",
)

# One key's newest rows (the one just put first) whose sizes add up to the room it has stay; its older ones go.
_TRIM_OWN = f"""
DELETE FROM {_RESPONSES} WHERE id IN (
    SELECT id FROM (
        SELECT id, sum(bytes) OVER (ORDER BY id = ? DESC, created_at DESC, id DESC) AS kept
        FROM {_RESPONSES} WHERE key_fingerprint IS ?
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
                for statement in RESPONSES.ddl(SQLITE, if_not_exists=True):
                    self._conn.execute(statement)
                exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
                if self._conn.execute(exists, (_OWNERS_TABLE,)).fetchone() is None:
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
        row = stored.to_row()
        size, owner = row["bytes"], stored.key_fingerprint
        if size > self.settings.max_row_bytes:
            return False
        with self._lock, _write(self._conn):
            if self.maintenance.due():
                self._expire()
            own, total = self._bytes(owner)
            excess = total + size - self.settings.max_bytes  # what must go for it to fit the whole store
            if excess > own:  # this key's older rows free too little: nothing goes, and it is not kept
                return False
            self._conn.execute(_PUT, row)
            room = min(self.settings.max_bytes_per_key, own + size - max(0, excess))
            if own + size > room:
                self._conn.execute(_TRIM_OWN, (stored.id, owner, room))
        return True

    def _bytes(self, owner: str | None) -> tuple[int, int]:
        """(the bytes this key's rows hold, the bytes all rows hold)."""
        own = self._conn.execute(SQL.owner_bytes, (owner or "",)).fetchone()[0]
        return own, self._conn.execute(SQL.total_bytes).fetchone()[0]

    def _get(self, response_id: str, key: str | None) -> StoredResponse | None:
        with self._lock:
            row = named_row(self._conn.execute(SQL.get, (response_id, key, self.settings.oldest_kept())))
        return StoredResponse.from_row(row) if row else None

    def _delete(self, response_id: str, key: str | None) -> bool:
        with self._lock:
            cursor = self._conn.execute(SQL.delete, (response_id, key))
        return cursor.rowcount > 0

    def _expire(self) -> None:
        """Retention (under the lock, in the put's transaction)."""
        self._conn.execute(SQL.expire, (self.settings.oldest_kept(),))
        self._conn.execute(SQL.forget_empty_owners)

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
