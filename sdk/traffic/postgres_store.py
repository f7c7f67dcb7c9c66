"""The traffic record in the state database (`state_db`): the functions of sdk.traffic.store, on
PostgreSQL, so the replicas of a `tandem serve` keep one record and a retrain sees all of their traffic.

The tables are those of the SQLite record, in the schema `tandem_traffic` (made by the state
database's migrations, sdk.state.schema): a connection here searches that schema first, so the
queries that read a record (sdk.traffic.rows, sdk.traffic.table) run unchanged on either store.

Connections are synchronous (psycopg 3), used from the record's writer thread, its reader and
the CLI, like the SQLite ones. A `TrafficConnection` opens a fresh connection when the one it
had broke (the database restarted): the writer's batch that broke is lost and logged, as a full
disk loses it in SQLite, and the next one goes through; a read is simply tried again.
"""

from __future__ import annotations

import contextlib
import json
import time

from sdk.state.database import CONNECT_TIMEOUT_S, redacted
from sdk.state.schema import MIGRATIONS
from sdk.traffic.schema import TrafficSchemaError
from sdk.traffic.store import REQUEST_COLUMNS, SIZE_SLACK, today

TRAFFIC_SCHEMA_VERSION = next(number for number, sql in MIGRATIONS if "CREATE SCHEMA tandem_traffic" in sql)
TABLES = ("requests", "labels", "counters")


class TrafficConnection:
    """A psycopg connection to the record, reopened after it breaks. `execute` answers a cursor
    (iterable, fetchone/fetchall) as sqlite3's does; statements commit on their own outside `transaction`."""

    def __init__(self, url: str):
        self.url = url
        self._conn = None
        self._in_transaction = False
        self._reopen()
        version = 0
        if self.execute("SELECT to_regclass('public.tandem_schema')").fetchone()[0] is not None:
            version = self.execute("SELECT coalesce(max(version), 0) FROM public.tandem_schema").fetchone()[0]
        if version < TRAFFIC_SCHEMA_VERSION:
            self.close()
            raise TrafficSchemaError(
                f"{redacted(url)} has no traffic record yet (state schema version {version}): a `tandem serve "
                "--state-db` with [traffic] record = true makes it"
            )

    def _reopen(self) -> None:
        import psycopg

        self._conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=int(CONNECT_TIMEOUT_S),
            options="-c search_path=tandem_traffic,public",
        )

    def _live(self):
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._reopen()
        return self._conn

    def execute(self, sql: str, params: tuple | list | None = None):
        """Outside a transaction, a statement that meets a connection the database closed is tried once more
        on a fresh one (the record runs only reads and deletes that way, which a second try cannot double)."""
        conn = self._live()
        try:
            return conn.execute(sql, params)
        except Exception:
            if self._in_transaction or not conn.broken:
                raise
        return self._live().execute(sql, params)

    @contextlib.contextmanager
    def transaction(self):
        with self._live().transaction():
            self._in_transaction = True
            try:
                yield self
            finally:
                self._in_transaction = False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def connect(url: str, *, create: bool = True) -> TrafficConnection:
    """A connection to the record in the state database at `url` (the tables are made by the
    state database's migrations, so `create` changes nothing: it is there for sdk.traffic.store's signature)."""
    del create
    try:
        return TrafficConnection(url)
    except TrafficSchemaError:
        raise
    except Exception as exc:
        raise RuntimeError(f"the traffic record in {redacted(url)} cannot be opened: {exc}") from exc


def transaction(conn: TrafficConnection):
    """One transaction: committed when the block ends, rolled back if it raises."""
    return conn.transaction()


def insert_request(conn: TrafficConnection, row: dict) -> None:
    unknown = set(row) - set(REQUEST_COLUMNS)
    if unknown:
        raise ValueError(f"not request columns: {sorted(unknown)}")
    columns = [c for c in REQUEST_COLUMNS if c in row]
    values = [json.dumps(row[c]) if c == "signals" and row[c] is not None else row[c] for c in columns]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != "id")
    conn.execute(
        f"INSERT INTO requests ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))}) "
        f"ON CONFLICT (id) DO UPDATE SET {updates}",
        values,
    )


def upsert_label(
    conn: TrafficConnection,
    response_id: str,
    source: str,
    weak: float | None,
    strong: float | None,
    detail: str = "",
    created_at: float | None = None,
) -> bool:
    """One label per (response, source): a repeat replaces it. False when the response is not recorded."""
    inserted = conn.execute(
        "INSERT INTO labels (response_id, source, weak, strong, created_at, detail) "
        "SELECT id, %s, %s, %s, %s, %s FROM requests WHERE id = %s "
        "ON CONFLICT (response_id, source) DO UPDATE SET weak = excluded.weak, strong = excluded.strong, "
        "created_at = excluded.created_at, detail = excluded.detail",
        (source, weak, strong, time.time() if created_at is None else created_at, detail, response_id),
    ).rowcount
    return inserted > 0


def bump_counter(conn: TrafficConnection, name: str, amount: int = 1, day: str | None = None) -> None:
    conn.execute(
        "INSERT INTO counters AS c (day, name, value) VALUES (%s, %s, %s) "
        "ON CONFLICT (day, name) DO UPDATE SET value = c.value + excluded.value",
        (day or today(), name, amount),
    )


def counter_today(conn: TrafficConnection, name: str) -> int:
    row = conn.execute("SELECT value FROM counters WHERE day = %s AND name = %s", (today(), name)).fetchone()
    return int(row[0]) if row else 0


def owner_of(conn: TrafficConnection, response_id: str) -> tuple[bool, str | None, str | None]:
    """(recorded, key fingerprint, tier that answered) of a response."""
    row = conn.execute("SELECT key_fingerprint, tier FROM requests WHERE id = %s", (response_id,)).fetchone()
    return (False, None, None) if row is None else (True, row[0], row[1])


def delete_older_than(conn: TrafficConnection, cutoff: float) -> int:
    """Rows created before `cutoff` (unix seconds) and their labels; counters of days before it."""
    import datetime

    deleted = conn.execute("DELETE FROM requests WHERE created_at < %s", (cutoff,)).rowcount
    cutoff_day = datetime.datetime.fromtimestamp(cutoff, datetime.timezone.utc).date().isoformat()
    conn.execute("DELETE FROM counters WHERE day < %s", (cutoff_day,))
    return deleted


def record_bytes(conn: TrafficConnection) -> int:
    """What the rows take (pg_column_size of each row): the size bound's measure. The tables' size on
    disk would not do: PostgreSQL keeps deleted rows' space for reuse, so it does not fall when rows go."""
    total = 0
    for table in TABLES:
        total += conn.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t").fetchone()[0]
    return int(total)


def enforce_size(conn: TrafficConnection, max_bytes: int) -> int:
    """Over `max_bytes`: delete the oldest rows (a tenth at a time) until under SIZE_SLACK of it."""
    deleted = 0
    while record_bytes(conn) > max_bytes * SIZE_SLACK:
        count = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
        if count == 0:
            break
        deleted += conn.execute(
            "DELETE FROM requests WHERE id IN (SELECT id FROM requests ORDER BY created_at LIMIT %s)",
            (max(1, count // 10),),
        ).rowcount
    return deleted


def purge(
    conn: TrafficConnection,
    *,
    older_than_s: float | None = None,
    key_fingerprint: str | None = None,
    everything: bool = False,
) -> int:
    """Delete rows (and their labels): all of them, those older than `older_than_s` seconds,
    and/or those of one key. Returns the requests deleted."""
    with conn.transaction():
        if everything:
            deleted = conn.execute("DELETE FROM requests").rowcount
            conn.execute("DELETE FROM counters")
            return deleted
        clauses, values = [], []
        if older_than_s is not None:
            clauses.append("created_at < %s")
            values.append(time.time() - older_than_s)
        if key_fingerprint is not None:
            clauses.append("key_fingerprint = %s")
            values.append(key_fingerprint)
        if not clauses:
            raise ValueError("purge needs everything, older_than_s or key_fingerprint")
        return conn.execute(f"DELETE FROM requests WHERE {' AND '.join(clauses)}", values).rowcount


def stats(conn: TrafficConnection) -> dict:
    """What the record holds, for `tandem traffic stats` (the keys of sdk.traffic.store.stats)."""
    one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
    return {
        "requests": one("SELECT count(*) FROM requests"),
        "by_tier": dict(conn.execute("SELECT tier, count(*) FROM requests GROUP BY tier").fetchall()),
        "with_embedding": one("SELECT count(*) FROM requests WHERE embedding IS NOT NULL"),
        "with_text": one("SELECT count(*) FROM requests WHERE prompt_text IS NOT NULL"),
        "labels": dict(conn.execute("SELECT source, count(*) FROM labels GROUP BY source").fetchall()),
        "counters": {
            name: int(value) for name, value in conn.execute("SELECT name, sum(value) FROM counters GROUP BY name")
        },
        "oldest": one("SELECT min(created_at) FROM requests"),
        "newest": one("SELECT max(created_at) FROM requests"),
        "bytes": record_bytes(conn),
    }
