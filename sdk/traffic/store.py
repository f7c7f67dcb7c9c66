"""Operations on a traffic record, used by its one writer thread (sdk.traffic.record), by `tandem
traffic`, and by training (`tandem router train --from-traffic`).

A record is a SQLite file (`connect` here), or the state database the replicas share
(sdk.traffic.postgres_store's connection, which runs these statements as written): either is a
`RecordConnection`. Its tables are declared once (sdk.state.tables.traffic) and these statements name
them as a file does (the state database's connection searches its `tandem_traffic` schema first). One
statement serves both where their SQL agrees (the upserts are the form both accept); the three places
they differ ask which one they hold: taking the write lock, measuring the record's size, and giving
freed space back. Rows are read by column name (sdk.state.declaration.named_row).

The file is created 0600 in a directory created 0700: it holds features derived from users'
prompts. WAL journal, so readers (feedback lookups, training, the CLI) never block the writer.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sdk.serving.api_keys import LOGGED_DIGITS
from sdk.state.declaration import named_row
from sdk.state.tables.traffic import REQUESTS
from sdk.traffic.schema import migrate

SIZE_SLACK = 0.9  # over the size bound, the oldest rows go until the file is below this share of it


@runtime_checkable
class RecordConnection(Protocol):
    """What these operations need of a record's connection: sqlite3.Connection (a file's) and
    sdk.traffic.postgres_store.TrafficConnection (the state database's) both are one. Statements take
    sqlite3's `?` placeholders; the cursor answered is iterable, with fetchone, fetchall, rowcount and
    description (sqlite3's or psycopg's)."""

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...

    def close(self) -> None: ...


def connect(path: str | os.PathLike, *, create: bool = True) -> sqlite3.Connection:
    """A connection with the schema current (migrated if older). `create=False`: the file must exist."""
    path = Path(path)
    if not path.exists():
        if not create:
            raise FileNotFoundError(f"no traffic record at {path}")
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=10.0, check_same_thread=False)
    try:
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # must precede the first table
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def is_file(conn: RecordConnection) -> bool:
    """Whether `conn` is a SQLite file's (else the state database's, sdk.traffic.postgres_store)."""
    return isinstance(conn, sqlite3.Connection)


@contextlib.contextmanager
def transaction(conn: RecordConnection):
    """One write transaction, committed when the block ends, rolled back if it raises (SQLite: BEGIN
    IMMEDIATE, the writer takes the file's lock up front)."""
    if not is_file(conn):
        with conn.transaction():
            yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def to_blob(vector) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype="<f4").tobytes()


def from_blob(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype="<f4")


REQUEST_COLUMNS = REQUESTS.column_names  # what a request's row may hold (sdk.state.tables.traffic)


def insert_request(conn: RecordConnection, row: dict) -> None:
    """One request's row (a repeated id replaces its columns; its labels stay)."""
    unknown = set(row) - set(REQUEST_COLUMNS)
    if unknown:
        raise ValueError(f"not request columns: {sorted(unknown)}")
    columns = [c for c in REQUEST_COLUMNS if c in row]
    values = [json.dumps(row[c]) if c == "signals" and row[c] is not None else row[c] for c in columns]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != "id")
    conn.execute(
        f"INSERT INTO requests ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
        f"ON CONFLICT (id) DO {f'UPDATE SET {updates}' if updates else 'NOTHING'}",
        values,
    )


def upsert_label(
    conn: RecordConnection,
    response_id: str,
    source: str,
    weak: float | None,
    strong: float | None,
    detail: str = "",
    created_at: float | None = None,
) -> bool:
    """One label per (response, source): a repeat replaces it. False when the response is not recorded."""
    written = conn.execute(
        "INSERT INTO labels (response_id, source, weak, strong, created_at, detail) "
        "SELECT id, ?, ?, ?, ?, ? FROM requests WHERE id = ? "
        "ON CONFLICT (response_id, source) DO UPDATE SET weak = excluded.weak, strong = excluded.strong, "
        "created_at = excluded.created_at, detail = excluded.detail",
        (source, weak, strong, time.time() if created_at is None else created_at, detail, response_id),
    ).rowcount
    return written > 0


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def bump_counter(conn: RecordConnection, name: str, amount: int = 1, day: str | None = None) -> None:
    conn.execute(
        "INSERT INTO counters (day, name, value) VALUES (?, ?, ?) "
        "ON CONFLICT (day, name) DO UPDATE SET value = counters.value + excluded.value",
        (day or today(), name, amount),
    )


def counter_today(conn: RecordConnection, name: str) -> int:
    row = named_row(conn.execute("SELECT value FROM counters WHERE day = ? AND name = ?", (today(), name)))
    return int(row["value"]) if row else 0


def owner_of(conn: RecordConnection, response_id: str) -> tuple[bool, str | None, str | None]:
    """(recorded, key fingerprint, tier that answered) of a response."""
    row = named_row(conn.execute("SELECT key_fingerprint, tier FROM requests WHERE id = ?", (response_id,)))
    return (False, None, None) if row is None else (True, row["key_fingerprint"], row["tier"])


def delete_older_than(conn: RecordConnection, cutoff: float) -> int:
    """Rows created before `cutoff` (unix seconds) and their labels; counters of days before it."""
    deleted = conn.execute("DELETE FROM requests WHERE created_at < ?", (cutoff,)).rowcount
    cutoff_day = datetime.datetime.fromtimestamp(cutoff, datetime.timezone.utc).date().isoformat()
    conn.execute("DELETE FROM counters WHERE day < ?", (cutoff_day,))
    return deleted


def record_bytes(conn: RecordConnection) -> int:
    """What the record takes: a file's pages in use times the page size (free pages not counted), or
    what the state database's rows take (TrafficConnection.record_bytes)."""
    if not is_file(conn):
        return conn.record_bytes()
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]


def enforce_size(conn: RecordConnection, max_bytes: int) -> int:
    """Over `max_bytes`: delete the oldest rows (a tenth at a time) until under SIZE_SLACK of it,
    then hand the freed pages back to the file system. Returns the rows deleted."""
    deleted = 0
    while record_bytes(conn) > max_bytes * SIZE_SLACK:
        count = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
        if count == 0:
            break
        deleted += conn.execute(
            "DELETE FROM requests WHERE id IN (SELECT id FROM requests ORDER BY created_at LIMIT ?)",
            (max(1, count // 10),),
        ).rowcount
    if deleted:
        _give_space_back(conn)
    return deleted


def purge(
    conn: RecordConnection,
    *,
    older_than_s: float | None = None,
    key_fingerprint: str | None = None,
    everything: bool = False,
) -> int:
    """Delete rows (and their labels): all of them, those older than `older_than_s` seconds,
    and/or those of one key: its id (the SHA-256 of the key), or the prefix of it the server logs
    (16 digits or more), or the exact owner of an earlier version's row. Returns the requests deleted."""
    if everything:
        deleted = conn.execute("DELETE FROM requests").rowcount
        conn.execute("DELETE FROM counters")
    else:
        clauses, values = [], []
        if older_than_s is not None:
            clauses.append("created_at < ?")
            values.append(time.time() - older_than_s)
        if key_fingerprint is not None:
            if len(key_fingerprint) >= LOGGED_DIGITS:  # what log lines show of a key's id
                clauses.append("substr(key_fingerprint, 1, ?) = ?")
                values += [len(key_fingerprint), key_fingerprint]
            else:
                clauses.append("key_fingerprint = ?")
                values.append(key_fingerprint)
        if not clauses:
            raise ValueError("purge needs everything, older_than_s or key_fingerprint")
        deleted = conn.execute(f"DELETE FROM requests WHERE {' AND '.join(clauses)}", values).rowcount
    _give_space_back(conn)
    return deleted


def _give_space_back(conn: RecordConnection) -> None:
    """A file hands its freed pages to the file system; PostgreSQL reuses a table's space on its own."""
    if is_file(conn):
        conn.execute("PRAGMA incremental_vacuum")


def stats(conn: RecordConnection) -> dict:
    """What the record holds, for `tandem traffic stats`."""
    one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
    by_tier = dict(conn.execute("SELECT tier, count(*) FROM requests GROUP BY tier").fetchall())
    by_source = dict(conn.execute("SELECT source, count(*) FROM labels GROUP BY source").fetchall())
    counters = {}
    for name, value in conn.execute("SELECT name, sum(value) FROM counters GROUP BY name"):
        counters[name] = value
    return {
        "requests": one("SELECT count(*) FROM requests"),
        "by_tier": by_tier,
        "with_embedding": one("SELECT count(*) FROM requests WHERE embedding IS NOT NULL"),
        "with_text": one("SELECT count(*) FROM requests WHERE prompt_text IS NOT NULL"),
        "labels": by_source,
        "counters": counters,
        "oldest": one("SELECT min(created_at) FROM requests"),
        "newest": one("SELECT max(created_at) FROM requests"),
        "bytes": record_bytes(conn),
    }
