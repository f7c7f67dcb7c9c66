"""Writes to the state database that a request's end leaves behind (sdk.state.database.defer): settling its
spend, returning its slot in flight, a stored response that could not be written at once.

They run on one task, in the order they were made, and never on a request's path. A write that fails, for
any reason (the database away, frozen, failed over to a read-only node), is tried again with a growing
pause until it lands: the books' writes (settles and slots) are never dropped, so every such write must be
idempotent (sdk.state.schema v5 keys them by batch or by request). Only a write marked droppable (a
stored response) is dropped, when the queue already holds `max_pending` writes; at that size the ledger
also refuses new budgeted work (sdk.budgets.postgres_ledger), so the queue stops growing with traffic.

Coalesced batches: the writes that would pile up one per request during an outage (settles, slots) are
gathered into one pending batch instead (`Coalesced`): everything added before the writer reaches the
batch goes into it, and its retries send that same batch, with the same id, so a batch that landed before
its reply was lost is recognised by the database and not applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sdk.protocol.errors import StateUnavailableError

logger = logging.getLogger("tandem.state")

RETRY_FIRST_S = 0.25  # the pause after a write's first failure; doubled each time, up to RETRY_MAX_S
RETRY_MAX_S = 10.0
LOG_EVERY_S = 10.0  # a write that keeps failing logs at most this often
DEFAULT_MAX_PENDING = 10_000

Write = Callable[[], Awaitable[object]]


@dataclass
class _Pending:
    write: Write
    droppable: bool
    since: float  # monotonic time it was deferred


class DeferredWrites:
    """The queue of writes and the task that makes them (module docstring)."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING, clock: Callable[[], float] = time.monotonic):
        if max_pending < 1:
            raise ValueError(f"state_db_max_pending_writes must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self.clock = clock
        self.num_dropped = 0  # droppable writes refused because the queue was full
        self.num_retries = 0  # failed tries, each followed by a pause and another try
        self._queue: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._retry_now: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._logged_at = float("-inf")

    def nudge(self) -> None:
        """Try the waiting write now rather than at the end of its pause (the database is back)."""
        if self._retry_now is not None:
            self._retry_now.set()

    def start(self) -> DeferredWrites:
        self._wakeup, self._idle, self._retry_now = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._task = asyncio.create_task(self._run(), name="tandem-state-writes")
        return self

    def defer(self, write: Write, droppable: bool = False) -> bool:
        """Queue `write`; False when it was droppable and the queue is full (it is not made). Never waits."""
        if droppable and self.backed_up:
            self.num_dropped += 1
            logger.error("a deferred state database write was dropped: %d writes already wait", len(self._queue))
            return False
        self._queue.append(_Pending(write, droppable, self.clock()))
        self._idle.clear()
        self._wakeup.set()
        return True

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def backed_up(self) -> bool:
        """The queue holds `max_pending` writes or more: new budgeted work is refused until it drains."""
        return len(self._queue) >= self.max_pending

    @property
    def oldest_age_s(self) -> float:
        """Seconds the oldest write still pending has waited (0 when none waits)."""
        return self.clock() - self._queue[0].since if self._queue else 0.0

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every write deferred so far has landed (TimeoutError past `timeout_s`)."""
        if self._idle is not None:
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            head = self._queue[0]
            await self._until_landed(head)
            self._queue.popleft()

    async def _until_landed(self, pending: _Pending) -> None:
        pause = RETRY_FIRST_S
        while True:
            try:
                await pending.write()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is retried: the books' writes never drop
                self.num_retries += 1
                self._log_failure(exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), pause)
            self._retry_now.clear()
            pause = min(RETRY_MAX_S, pause * 2)

    def _log_failure(self, exc: Exception) -> None:
        now = self.clock()
        if now - self._logged_at < LOG_EVERY_S:
            return
        self._logged_at = now
        logger.warning(
            "%d state database writes wait (the oldest for %.1f s); retrying: %s",
            len(self._queue),
            self.oldest_age_s,
            exc.detail if isinstance(exc, StateUnavailableError) and exc.detail else type(exc).__name__,
        )


B = TypeVar("B")


@dataclass
class Coalesced(Generic[B]):
    """One pending batch of many small writes of a kind (module docstring). `new_batch()` makes an empty batch
    (with a fresh id); `send(batch)` writes it, idempotently by its id."""

    writes: DeferredWrites
    new_batch: Callable[[], B]
    send: Callable[[B], Awaitable[object]]
    _next: B | None = None  # gathering: what the next write will send
    _sending: B | None = None  # frozen: being written (and retried) now
    _scheduled: bool = field(default=False)

    def add(self, fill: Callable[[B], None]) -> None:
        """Put something into the batch the writer will send next (never waits)."""
        if self._next is None:
            self._next = self.new_batch()
        fill(self._next)
        if not self._scheduled:
            self._scheduled = True
            self.writes.defer(self._write)

    @property
    def waiting(self) -> list[B]:
        """The batches not yet landed: the one being sent, then the one gathering."""
        return [batch for batch in (self._sending, self._next) if batch is not None]

    async def _write(self) -> None:
        if self._sending is None:  # the first try of this write: freeze what has gathered
            self._sending, self._next, self._scheduled = self._next, None, False
        await self.send(self._sending)
        self._sending = None
