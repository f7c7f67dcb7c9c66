"""The traffic record in the state database (`state_db`): a connection that sdk.traffic.store's
operations run on as they run on a SQLite file, so the replicas of a `tandem serve` keep one record
and a retrain sees all of their traffic.

The tables are those of the SQLite record, in the schema `tandem_traffic` (made by the state
database's migrations, sdk.state.schema): a connection here searches that schema first, and
turns the statements' `?` placeholders into psycopg's, so the same statements (sdk.traffic.store,
sdk.traffic.rows, sdk.traffic.table) run unchanged on either.

Connections are synchronous (psycopg 3), used from the record's writer thread, its reader and
the CLI, like the SQLite ones. A `TrafficConnection` opens a fresh connection when the one it
had broke (the database restarted): the writer's batch that broke is lost and logged, as a full
disk loses it in SQLite, and the next one goes through; a read is simply tried again.
"""

from __future__ import annotations

import contextlib

from sdk.state.database import CONNECT_TIMEOUT_S
from sdk.state.redaction import redacted
from sdk.state.schema import MIGRATIONS
from sdk.traffic.schema import TrafficSchemaError

TRAFFIC_SCHEMA_VERSION = next(number for number, sql in MIGRATIONS if "CREATE SCHEMA tandem_traffic" in sql)
TABLES = ("requests", "labels", "counters")


class TrafficConnection:
    """A psycopg connection to the record, reopened after it breaks. `execute` answers a cursor
    (iterable, fetchone/fetchall, rowcount) as sqlite3's does; statements commit on their own
    outside `transaction`."""

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

        # The record's connections are synchronous (its writer thread, the CLI): no client-side deadline can cut a
        # call short here, so the server's own limits and TCP keepalives bound what a slow or vanished server costs.
        self._conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=int(CONNECT_TIMEOUT_S),
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
            options="-c search_path=tandem_traffic,public -c statement_timeout=30000 -c lock_timeout=10000",
        )

    def _live(self):
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._reopen()
        return self._conn

    def execute(self, sql: str, params: tuple | list | None = None):
        """Run one statement written for sqlite3 (`?` placeholders; the record's statements hold no other
        `?` or `%`). Outside a transaction, a statement that meets a connection the database closed is tried
        once more on a fresh one (the record runs only reads and deletes that way, which a second try cannot
        double)."""
        sql = sql.replace("?", "%s")
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

    def record_bytes(self) -> int:
        """What the rows take (pg_column_size of each row): the size bound's measure. The tables' size on
        disk would not do: PostgreSQL keeps deleted rows' space for reuse, so it does not fall when rows go."""
        total = 0
        for table in TABLES:
            total += self.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t").fetchone()[0]
        return int(total)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def connect(url: str, *, create: bool = True) -> TrafficConnection:
    """A connection to the record in the state database at `url`. Its tables are made by the state
    database's migrations (a `tandem serve --state-db` start), so `create` changes nothing here."""
    del create
    try:
        return TrafficConnection(url)
    except TrafficSchemaError:
        raise
    except Exception as exc:
        raise RuntimeError(f"the traffic record in {redacted(url)} cannot be opened: {exc}") from exc
