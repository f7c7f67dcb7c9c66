"""The traffic record in the state database (`state_db`): a connection that sdk.traffic.store's
operations run on as they run on a SQLite file, so the replicas of a `tandem serve` keep one record
and a retrain sees all of their traffic.

The tables are those of the SQLite record (declared once: sdk.state.tables.traffic), in the schema
`tandem_traffic` (made by the state database's migrations, sdk.state.schema): a connection here searches
that schema first, and turns the statements' `?` placeholders into psycopg's, so the same statements
(sdk.traffic.store, sdk.traffic.rows, sdk.traffic.table) run unchanged on either.

Connections are synchronous (psycopg 3), used from the record's writer thread, its reader and the CLI,
like the SQLite ones, and opened as every connection to the state database is (sdk.state.connection:
keepalives and the server's own statement and lock timeouts, since nothing client-side can cut a
synchronous call short). One that broke (the database restarted) is opened again at its next use: the
writer's batch that broke is lost and logged, as a full disk loses it in SQLite, and the next one goes
through; a read is simply tried again.
"""

from __future__ import annotations

from sdk.state.connection import ReopeningConnection
from sdk.state.redaction import redacted
from sdk.state.schema import MIGRATIONS
from sdk.state.tables.replicas import SCHEMA_VERSIONS
from sdk.state.tables.traffic import RECORD_TABLES
from sdk.traffic.schema import TrafficSchemaError

TRAFFIC_SCHEMA_VERSION = next(number for number, sql in MIGRATIONS if "CREATE SCHEMA tandem_traffic" in sql)
SEARCH_PATH = "tandem_traffic,public"  # the record's tables by the names the SQLite file gives them


class TrafficConnection(ReopeningConnection):
    """A connection to the record. `execute` takes sqlite3's `?` placeholders (the record's statements hold no
    other `?` or `%`) and answers a cursor (iterable, fetchone/fetchall, rowcount, description) as sqlite3's
    does; outside a transaction, a statement that met a connection the database closed is tried once more on
    a fresh one (the record runs only reads and deletes that way, which a second try cannot double)."""

    def __init__(self, url: str):
        super().__init__(url, search_path=SEARCH_PATH)
        version = 0
        versions = f"public.{SCHEMA_VERSIONS.postgres}"
        if self.execute(f"SELECT to_regclass('{versions}')").fetchone()[0] is not None:
            version = self.execute(f"SELECT coalesce(max(version), 0) FROM {versions}").fetchone()[0]
        if version < TRAFFIC_SCHEMA_VERSION:
            self.close()
            raise TrafficSchemaError(
                f"{redacted(url)} has no traffic record yet (state schema version {version}): a `tandem serve "
                "--state-db` with [traffic] record = true makes it"
            )

    def execute(self, sql: str, params: tuple | list | None = None):
        return super().execute(sql.replace("?", "%s"), params)

    def record_bytes(self) -> int:
        """What the rows take (pg_column_size of each row): the size bound's measure. The tables' size on
        disk would not do: PostgreSQL keeps deleted rows' space for reuse, so it does not fall when rows go."""
        total = 0
        for table in RECORD_TABLES:
            total += self.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table.postgres} t").fetchone()[0]
        return int(total)


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
