"""The connection to the state database the replicas of a server share (`state_db`).

    state = await StateDatabase(url, lease_s=30).open()   # StateDatabaseError: unreachable, or a newer schema
    async with state.transaction() as conn: ...           # StateUnavailableError while it is unreachable
    state.defer(write)                                    # a write that must happen, in order, when it can
    await state.close()

One asyncio pool (psycopg 3) per process, opened in the serving event loop. On open the schema is
migrated (sdk.state.schema) and this replica registered with a lease; a heartbeat task renews it
every lease/3 and deletes what expired replicas hold. The heartbeat is also how the process learns
that the database went away and came back: `available` and `last_error` say it (/health,
/metrics), and nothing needs a restart.

Deferred writes are what ends a request (settling its spend, returning its in-flight slot): they
run on one task in the order they were made, and one that fails because the database is away is
retried until it is back, so an outage delays them but loses none while the process lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

from sdk.protocol.errors import StateUnavailableError
from sdk.state.schema import LATEST, MIGRATION_LOCK, MIGRATIONS

logger = logging.getLogger("tandem.state")

DEFAULT_LEASE_S = 30.0
CONNECT_TIMEOUT_S = 5.0
POOL_SIZE = 8
RETRY_WRITE_S = 1.0  # a deferred write that failed waits this long before it is tried again


class StateDatabaseError(RuntimeError):
    """The state database cannot be used at start (the server refuses to start and says why)."""


def redacted(url: str) -> str:
    """`url` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_url(url: str) -> str:
    """`url`, if it names a PostgreSQL database (ValueError naming the setting otherwise)."""
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise ValueError(f"state_db must be a postgresql:// URL, got {redacted(url)!r}")
    return url


class StateDatabase:
    def __init__(self, url: str, lease_s: float = DEFAULT_LEASE_S, pool_size: int = POOL_SIZE):
        self.url = check_url(url)
        self.lease_s = float(lease_s)
        self.pool_size = pool_size
        self.replica_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.available = False
        self.last_error: str | None = None
        self.outages = 0  # times the database went from reachable to unreachable while serving
        self._pool = None
        self._heartbeat: asyncio.Task | None = None
        self._writes: asyncio.Queue | None = None
        self._writer: asyncio.Task | None = None

    @property
    def where(self) -> str:
        return f"the state database {redacted(self.url)}"

    async def open(self) -> StateDatabase:
        try:
            from psycopg_pool import AsyncConnectionPool
        except ImportError as exc:
            raise StateDatabaseError(
                "state_db needs psycopg 3 with its pool: pip install 'tandem-llm[postgres]'"
            ) from exc
        self._pool = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            timeout=CONNECT_TIMEOUT_S,
            kwargs={"autocommit": True, "connect_timeout": int(CONNECT_TIMEOUT_S)},
            name="tandem-state",
        )
        try:
            await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            await self._migrate()
            await self._renew_lease()
        except StateDatabaseError:
            await self._pool.close()
            raise
        except Exception as exc:
            await self._pool.close()
            raise StateDatabaseError(f"{self.where} cannot be reached: {_reason(exc)}") from exc
        self.available = True
        self._writes = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop(), name="tandem-state-writes")
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="tandem-state-heartbeat")
        logger.info("state shared through %s (replica %s, lease %gs)", self.where, self.replica_id, self.lease_s)
        return self

    async def _migrate(self) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await conn.execute("CREATE TABLE IF NOT EXISTS tandem_schema (version INTEGER NOT NULL)")
            row = await (await conn.execute("SELECT max(version) FROM tandem_schema")).fetchone()
            version = row[0] or 0
            if version > LATEST:
                raise StateDatabaseError(
                    f"{self.where} has schema version {version}, written by a newer tandem (this one knows up to "
                    f"{LATEST}): upgrade this replica"
                )
            for number, sql in MIGRATIONS:
                if number > version:
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO tandem_schema (version) VALUES (%s)", (number,))
                    logger.info("state database migrated to schema version %d", number)

    async def _renew_lease(self) -> None:
        """Push this replica's lease forward, and delete what replicas whose lease ran out still hold."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO tandem_replicas (id, expires_at) VALUES (%s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
                (self.replica_id, self.lease_s),
            )
            expired = "SELECT id FROM tandem_replicas WHERE expires_at <= now()"
            await conn.execute(f"DELETE FROM tandem_reservations WHERE replica IN ({expired})")
            await conn.execute(f"DELETE FROM tandem_in_flight WHERE replica IN ({expired})")
            await conn.execute("DELETE FROM tandem_replicas WHERE expires_at <= now()")
            # Buckets that have refilled and failures forgotten: a fresh row would be the same.
            await conn.execute("DELETE FROM tandem_rate_buckets WHERE full_at < extract(epoch FROM now())")
            await conn.execute("DELETE FROM tandem_auth_failures WHERE forget_at < extract(epoch FROM now())")

    async def _heartbeat_loop(self) -> None:
        while True:
            # While the database is away it is asked every second, so serving resumes soon after it is back.
            await asyncio.sleep(self.lease_s / 3 if self.available else min(1.0, self.lease_s / 3))
            try:
                if not self.available:
                    await self._pool.check()  # the connections the outage broke go; fresh ones replace them
                await self._renew_lease()
            except Exception as exc:
                self._went_away(exc)
            else:
                self._came_back()

    def _went_away(self, exc: BaseException) -> None:
        self.last_error = _reason(exc)
        if self.available:
            self.available = False
            self.outages += 1
            logger.error("%s is unreachable: %s (budgeted requests get 503 until it is back)", self.where, exc)

    def _came_back(self) -> None:
        """The heartbeat reached the database (requests only ever find it gone)."""
        if not self.available:
            self.available = True
            logger.info("%s is reachable again", self.where)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator:
        """A pooled connection (autocommit: each statement is atomic on its own). StateUnavailableError when
        the database cannot be reached, or at once while the heartbeat has not seen it back since it went
        away (no request waits on a dead pool)."""
        import psycopg
        from psycopg_pool import PoolTimeout

        if not self.available:
            raise StateUnavailableError(f"{self.where} is unreachable: {self.last_error}")
        try:
            async with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            # Every connection busy for CONNECT_TIMEOUT_S, or none can be made: this request is refused, but
            # only the heartbeat, which asks the database itself, decides that it is away.
            raise StateUnavailableError(f"{self.where} did not answer in time: {_reason(exc)}") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._went_away(exc)
            raise StateUnavailableError(f"{self.where} is unreachable: {_reason(exc)}") from exc

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator:
        """A connection in a transaction (several statements, all or none)."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def call(self, sql: str, params: tuple = ()) -> list[tuple]:
        """One statement (no BEGIN/COMMIT round trips): its rows. The decisions are single calls of the
        schema's functions, so this is their path."""
        async with self.connection() as conn:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchall() if cursor.description else []

    def defer(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run `write()` on the writer task, after every write deferred before it; retried while the
        database is away. Never waits (an event-loop callback or a `finally` may call it)."""
        self._writes.put_nowait(write)

    async def _write_loop(self) -> None:
        while True:
            write = await self._writes.get()
            try:
                while True:
                    try:
                        await write()
                        break
                    except StateUnavailableError:
                        await asyncio.sleep(RETRY_WRITE_S)
                    except Exception:
                        logger.exception("a state database write failed and is dropped")
                        break
            finally:
                self._writes.task_done()

    @property
    def pending_writes(self) -> int:
        return self._writes.qsize() if self._writes is not None else 0

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every write deferred so far has run."""
        if self._writes is not None:
            await asyncio.wait_for(self._writes.join(), timeout_s)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Run what is deferred (while the database answers), give up this replica's lease, close the pool."""
        if self._pool is None:
            return
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        try:
            await self.flush(timeout_s)
        except TimeoutError:
            logger.error("%d state database writes not made before shutdown", self.pending_writes)
        if self._writer is not None:
            self._writer.cancel()
        with contextlib.suppress(Exception):  # what it still holds goes with its row; else the lease ends it
            await self.call("DELETE FROM tandem_reservations WHERE replica = %s", (self.replica_id,))
            await self.call("DELETE FROM tandem_in_flight WHERE replica = %s", (self.replica_id,))
            await self.call("DELETE FROM tandem_replicas WHERE id = %s", (self.replica_id,))
        await self._pool.close()
        self._pool = None


async def open_state_database(listener) -> StateDatabase | None:
    """The state database a server's listener settings name (`state_db`, `state_db_lease_s`: [server] or
    [cloud_server]), open; None when they name none. StateDatabaseError when it cannot be used."""
    if not listener.state_db:
        return None
    return await StateDatabase(listener.state_db, listener.state_db_lease_s).open()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
