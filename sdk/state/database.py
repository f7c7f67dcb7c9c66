"""The connection to the state database the replicas of a server share (`state_db`).

    state = await StateDatabase(url, lease_s=30).open()   # StateDatabaseError: unreachable, or a newer schema
    rows = await state.call("SELECT ...", params)         # StateUnavailableError: away, or no answer in time
    await state.run(fn)                                   # fn(conn): several statements, one transaction
    state.defer(write)                                    # a write that must land, in order, when it can
    await state.close()

One asyncio pool (psycopg 3) per process, opened in the serving event loop. On open the schema is
migrated (sdk.state.schema) and this replica registered with a lease (sdk.state.lease); a heartbeat task
renews it every lease/3 and deletes what expired replicas hold. The heartbeat is also how the process
learns that the database went away and came back: `available` says it (/health, /metrics), and nothing
needs a restart.

**A deadline on every call, kept by the client.** A server-side `statement_timeout` cannot fire while the
server is frozen (SIGSTOP, a hung host), and a pooled connection waits on its socket for ever. So every
call runs as a task this process abandons at its deadline (`timeout_s`, `state_db_timeout_s`, 2 s by
default): the caller gets StateUnavailableError then, the database is marked away (later calls fail at
once until the heartbeat sees it back, so no request waits twice), and the abandoned task ends its
connection in the background (psycopg cancels the query; the pool drops the connection).

The pool's connections take sdk.state.connection's options (keepalives, the server's own statement and lock
timeouts a second past the deadline), as every other connection to the database does.

**What callers see of a failure**: StateUnavailableError's plain message with a reference; the database's
address and the driver's error only in this module's log lines (the URL's password redacted) and in
/admin/status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from sdk.protocol.errors import StateUnavailableError
from sdk.state.connection import CONNECT_TIMEOUT_S, pool_options  # read at open (the tests shorten it here)
from sdk.state.declaration import POSTGRES
from sdk.state.lease import RELEASE, RENEW, SWEEP, Lease
from sdk.state.redaction import check_url, reason as _reason, redacted
from sdk.state.schema import LATEST, MIGRATION_LOCK, MIGRATIONS
from sdk.state.tables.replicas import SCHEMA_VERSIONS
from sdk.state.writes import DEFAULT_MAX_PENDING, DeferredWrites, Write

logger = logging.getLogger("tandem.state")

DEFAULT_LEASE_S = 30.0
DEFAULT_TIMEOUT_S = 2.0  # a call's client-side deadline (admission waits at most this on the database)
POOL_SIZE = 8
PROBE_EVERY_S = 1.0  # while the database is away the heartbeat asks for it this often

T = TypeVar("T")


class StateDatabaseError(RuntimeError):
    """The state database cannot be used at start (the server refuses to start and says why)."""


class StateDatabase:
    def __init__(
        self,
        url: str,
        lease_s: float = DEFAULT_LEASE_S,
        pool_size: int = POOL_SIZE,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_pending_writes: int = DEFAULT_MAX_PENDING,
    ):
        if not timeout_s > 0:
            raise ValueError(f"state_db_timeout_s must be > 0, got {timeout_s}")
        self.url = check_url(url)
        self.lease = Lease(lease_s)
        self.lease_s = self.lease.lease_s
        self.pool_size = pool_size
        self.timeout_s = float(timeout_s)
        self.replica_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.available = False
        self.last_error: str | None = None  # the driver's words, redacted: logs and /admin/status only
        self.outages = 0  # times the database went from reachable to unreachable while serving
        self.writes = DeferredWrites(max_pending_writes)
        self._pool = None
        self._heartbeat: asyncio.Task | None = None
        self._abandoned: set[asyncio.Task] = set()  # calls past their deadline, ending in the background
        self._went_away_event = asyncio.Event()

    @property
    def where(self) -> str:
        """The database, for log lines (never for callers)."""
        return f"the state database {redacted(self.url)}"

    @property
    def fenced(self) -> bool:
        """This replica's lease may lapse before it can renew it: no budgeted work now (sdk.state.lease)."""
        return self.lease.fenced

    # -- life cycle ---------------------------------------------------------------------------

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
            kwargs=pool_options(self.timeout_s, CONNECT_TIMEOUT_S),
            name="tandem-state",
        )
        try:
            await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            await self._migrate()
            sent = self.lease.clock()
            await self._renew()
            self.lease.renewed(sent)
        except StateDatabaseError:
            await self._pool.close()
            raise
        except Exception as exc:
            await self._pool.close()
            raise StateDatabaseError(f"{self.where} cannot be reached: {_reason(exc)}") from exc
        self.available = True
        self.writes.start()
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="tandem-state-heartbeat")
        logger.info("state shared through %s (replica %s, lease %gs)", self.where, self.replica_id, self.lease_s)
        return self

    async def _migrate(self) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = 0")  # the one unbounded statement: DDL at start
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            (versions,) = SCHEMA_VERSIONS.ddl(POSTGRES, if_not_exists=True)
            await conn.execute(versions)
            row = await (await conn.execute(f"SELECT max(version) FROM {SCHEMA_VERSIONS.postgres}")).fetchone()
            version = row[0] or 0
            if version > LATEST:
                raise StateDatabaseError(
                    f"{self.where} has schema version {version}, written by a newer tandem (this one knows up to "
                    f"{LATEST}): upgrade this replica"
                )
            for number, sql in MIGRATIONS:
                if number > version:
                    await conn.execute(sql)
                    await conn.execute(f"INSERT INTO {SCHEMA_VERSIONS.postgres} (version) VALUES (%s)", (number,))
                    logger.info("state database migrated to schema version %d", number)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Land what is deferred (while the database answers), give up this replica's lease, close the pool."""
        if self._pool is None:
            return
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        try:
            await self.flush(timeout_s)
        except TimeoutError:
            logger.error("%d state database writes not made before shutdown", self.writes.pending)
        await self.writes.close()
        for sql in RELEASE:
            try:  # what it still holds goes with its row; else the lease ends it
                await self._bounded(_statement(sql, (self.replica_id,)), self.timeout_s, probing=True)
            except StateUnavailableError:
                break
        for task in list(self._abandoned):
            task.cancel()
        await self._pool.close()
        self._pool = None

    # -- the heartbeat ------------------------------------------------------------------------

    async def _renew(self, conn=None) -> None:
        """Push this replica's lease forward and sweep what expired (one transaction)."""

        async def renew(conn) -> None:
            async with conn.transaction():
                await conn.execute(RENEW, (self.replica_id, self.lease_s))
                for sql in SWEEP:
                    await conn.execute(sql)

        if conn is not None:
            await renew(conn)
            return
        async with self._pool.connection() as fresh:
            await renew(fresh)

    async def _heartbeat_loop(self) -> None:
        while True:
            # A call that finds the database away wakes the heartbeat at once: it probes every second from then.
            interval = self.lease.heartbeat_s if self.available else min(PROBE_EVERY_S, self.lease.heartbeat_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._went_away_event.wait(), interval)
            self._went_away_event.clear()
            if not self.available:
                await asyncio.sleep(min(PROBE_EVERY_S, self.lease.heartbeat_s) / 4)  # not on the failed call's heels
            await self.heartbeat()

    async def heartbeat(self) -> bool:
        """Renew the lease once (bounded by lease/6); whether it was renewed. Also how the database is seen back."""
        sent = self.lease.clock()

        async def probe(conn) -> None:
            await self._renew(conn)

        try:
            if not self.available:
                # The connections the outage broke go; fresh ones replace them.
                await asyncio.wait_for(self._pool.check(), self.lease.renew_timeout_s)
            await self._bounded(probe, self.lease.renew_timeout_s, probing=True)
        except StateUnavailableError:
            return False  # _bounded noted why
        except Exception as exc:  # noqa: BLE001 - the pool's check timing out, or failing: not renewed
            self._went_away(_reason(exc) if not isinstance(exc, TimeoutError) else "the pool's check did not end")
            return False
        self.lease.renewed(sent)
        self._came_back()
        return True

    def _went_away(self, reason: str) -> None:
        self.last_error = reason
        if self.available:
            self.available = False
            self._went_away_event.set()
            self.outages += 1
            logger.error(
                "%s is unavailable (outage %s): %s; budgeted requests get 503 until it is back",
                self.where,
                self.reference,
                reason,
            )

    def _came_back(self) -> None:
        if not self.available:
            self.available = True
            self.writes.nudge()  # the writes waiting out a pause go now
            logger.info("%s is reachable again (outage %s over)", self.where, self.reference)

    @property
    def reference(self) -> str:
        """What callers are told to quote: this replica and its outage number (the log says the rest)."""
        return f"{self.replica_id.rsplit(':', 1)[-1]}-{self.outages}"

    # -- calls --------------------------------------------------------------------------------

    async def call(
        self, sql: str, params: tuple | Mapping[str, Any] = (), timeout_s: float | None = None, *, by_name: bool = False
    ) -> list:
        """One statement: its rows, as tuples or, `by_name`, as {column: value}. StateUnavailableError when the
        database is away or has not answered within `timeout_s` (default: this database's deadline)."""
        return await self.run(_statement(sql, params, by_name), timeout_s)

    async def run(self, fn: Callable[[Any], Awaitable[T]], timeout_s: float | None = None) -> T:
        """`fn(conn)` on a pooled connection, under the same deadline (open `conn.transaction()` inside it for
        several statements that must land together)."""
        if not self.available:
            raise self.unavailable()
        return await self._bounded(fn, self.timeout_s if timeout_s is None else timeout_s)

    def unavailable(self) -> StateUnavailableError:
        """The error callers get while the database is away (its details are in the log line of the outage)."""
        return StateUnavailableError(
            f"the state database is unavailable; retry shortly (reference {self.reference})", detail=self.last_error
        )

    async def _bounded(self, fn: Callable[[Any], Awaitable[T]], timeout_s: float, probing: bool = False) -> T:
        """`fn` on a connection as a task abandoned at `timeout_s` (module docstring). `probing`: the heartbeat's
        own calls, made while the database is marked away."""
        task = asyncio.create_task(self._on_connection(fn))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
        except asyncio.CancelledError:
            task.cancel()
            self._abandon(task)
            raise
        if not done:
            task.cancel()  # psycopg cancels the query; the pool drops the connection (in the background)
            self._abandon(task)
            self._went_away(f"no answer within {timeout_s:g} s")
            raise self.unavailable()
        return task.result()

    def _abandon(self, task: asyncio.Task) -> None:
        self._abandoned.add(task)
        task.add_done_callback(_forget_from(self._abandoned))

    async def _on_connection(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            async with self._pool.connection(timeout=self.timeout_s) as conn:
                return await fn(conn)
        except PoolTimeout as exc:
            # Every connection busy, or none can be made: this call is refused; the heartbeat decides whether the
            # database is away.
            raise StateUnavailableError(
                f"the state database is busy; retry shortly (reference {self.reference})", detail=_reason(exc)
            ) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._went_away(_reason(exc))
            raise self.unavailable() from exc
        except psycopg.Error as exc:
            # Anything else the database answered (a read-only node after a failover, a statement it refused):
            # the call failed and the caller treats it as the database being unavailable, logged here.
            logger.warning("a call to %s failed (reference %s): %s", self.where, self.reference, _reason(exc))
            raise StateUnavailableError(
                f"the state database refused the call; retry shortly (reference {self.reference})",
                detail=_reason(exc),
            ) from exc

    # -- deferred writes ----------------------------------------------------------------------

    def defer(self, write: Write, droppable: bool = False) -> bool:
        """Make `write()` on the writer task after every write deferred before it, retried until it lands
        (sdk.state.writes); False when a droppable one was dropped because the queue is full. Never waits."""
        return self.writes.defer(write, droppable)

    @property
    def pending_writes(self) -> int:
        return self.writes.pending

    @property
    def backed_up(self) -> bool:
        """Deferred writes have reached their bound: budgeted work is refused until they drain."""
        return self.writes.backed_up

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every write deferred so far has landed."""
        await self.writes.flush(timeout_s)

    def status(self) -> dict:
        """What /admin/status shows of the database (the redacted address and the last error included)."""
        return {
            "where": redacted(self.url),
            "available": self.available,
            "fenced": self.fenced,
            "lease_age_s": self.lease.age_s,
            "outages": self.outages,
            "reference": self.reference,
            "last_error": self.last_error,
            "pending_writes": self.writes.pending,
            "oldest_pending_write_s": round(self.writes.oldest_age_s, 3),
        }


def _statement(sql: str, params, by_name: bool = False) -> Callable[[Any], Awaitable[list]]:
    async def run(conn) -> list:
        if by_name:
            from psycopg.rows import dict_row

            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(sql, params)
        else:
            cursor = await conn.execute(sql, params)
        return await cursor.fetchall() if cursor.description else []

    return run


def _forget_from(tasks: set[asyncio.Task]) -> Callable[[asyncio.Task], None]:
    def forget(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an abandoned call's error was already answered for

    return forget


async def open_state_database(listener) -> StateDatabase | None:
    """The state database a server's listener settings name ([server] or [cloud_server]: `state_db`,
    `state_db_lease_s`, `state_db_timeout_s`, `state_db_max_pending_writes`), open; None when they name none.
    StateDatabaseError when it cannot be used."""
    if not listener.state_db:
        return None
    return await StateDatabase(
        listener.state_db,
        listener.state_db_lease_s,
        timeout_s=listener.state_db_timeout_s,
        max_pending_writes=listener.state_db_max_pending_writes,
    ).open()
