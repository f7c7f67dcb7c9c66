"""How this process connects to the state database: one set of options for every connection, pooled
(sdk.state.database's asyncio pool, under a client-side deadline on every call) or synchronous (the
traffic record's writer thread, its reader and the CLI: sdk.traffic.postgres_store; the retrain lock and
the routers table: sdk.traffic.shared_routers). No other module opens one with options of its own.

- `connect_timeout` (CONNECT_TIMEOUT_S) bounds opening a connection; TCP keepalives find a peer that
  went away without a word.
- The server's own statement and lock timeouts end a statement or a lock wait past them (when the server
  still runs). The pool's sit just past its calls' deadline, as a second line behind it; a synchronous
  connection has no client-side deadline, so its own (SYNC_STATEMENT_TIMEOUT_S, SYNC_LOCK_TIMEOUT_S)
  bound what a slow server costs.
- Retries: a synchronous connection that broke (the database restarted) is reopened at its next use, and
  a statement outside a transaction that met the break is tried once more (ReopeningConnection). The
  pool's calls are not retried; the writes that must land are (sdk.state.writes).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

CONNECT_TIMEOUT_S = 5.0  # opening a connection, pooled or not
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
SYNC_STATEMENT_TIMEOUT_S = 30.0  # a synchronous connection's statements (a record's maintenance deletes included)
SYNC_LOCK_TIMEOUT_S = 10.0


def connection_options(
    statement_timeout_s: float,
    lock_timeout_s: float,
    *,
    idle_in_transaction_s: float | None = None,
    search_path: str | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> dict[str, Any]:
    """psycopg's connection arguments: autocommit, the timeouts above, keepalives, and a search path."""
    settings = [f"search_path={search_path}"] if search_path else []
    settings += [f"statement_timeout={_ms(statement_timeout_s)}", f"lock_timeout={_ms(lock_timeout_s)}"]
    if idle_in_transaction_s is not None:
        settings.append(f"idle_in_transaction_session_timeout={_ms(idle_in_transaction_s)}")
    return {
        "autocommit": True,
        "connect_timeout": int(connect_timeout_s),
        **KEEPALIVES,
        "options": " ".join(f"-c {setting}" for setting in settings),
    }


def pool_options(call_timeout_s: float, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """The pool's connections: the server's limits a second past a call's client-side deadline, and a
    transaction left idle ended after five times that."""
    server_s = (math.ceil(call_timeout_s * 1000) + 1000) / 1000
    return connection_options(
        server_s, server_s, idle_in_transaction_s=server_s * 5, connect_timeout_s=connect_timeout_s
    )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def connect(url: str, *, search_path: str | None = None):
    """A synchronous psycopg connection with the options above."""
    import psycopg

    return psycopg.connect(
        url, **connection_options(SYNC_STATEMENT_TIMEOUT_S, SYNC_LOCK_TIMEOUT_S, search_path=search_path)
    )


class ReopeningConnection:
    """A synchronous connection (`connect`) opened again when the one it had broke. Outside a transaction, a
    statement that meets a connection the database closed is tried once more on a fresh one: for callers whose
    statements a second try cannot double (reads, deletes, upserts). Statements commit on their own outside
    `transaction`."""

    def __init__(self, url: str, *, search_path: str | None = None):
        self.url = url
        self.search_path = search_path
        self._conn = None
        self._in_transaction = False
        self._live()

    def _live(self):
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.url, search_path=self.search_path)
        return self._conn

    def execute(self, sql: str, params: Any = None):
        """Run one statement (psycopg's placeholders): its cursor."""
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
