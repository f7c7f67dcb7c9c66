"""One thread that owns a SQLite connection and writes what other threads queue, a batch at a
time: the spend ledger (sdk.budgets.ledger) and the traffic record (sdk.traffic.record) keep
their files this way, so the event loop never waits on a disk.

    writer = SQLiteWriter("spend", write_batch)   # write_batch(conn, items): one transaction
    writer.start(conn)                            # the thread owns conn from here and closes it
    writer.put(item)                              # or offer(item): False when a bounded queue is full
    writer.flush()                                # everything queued so far is written
    writer.close()
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable

_STOP = object()


class SQLiteWriter:
    """Items in arrival order, in batches, to `write_batch(conn, items)` on one writer thread.

    name: what the thread ("tandem-<name>-writer") and a flush that times out call it.
    queue_size: items waiting for the writer at most (0: no bound; a full queue refuses `offer`).
    max_batch: items per batch at most (None: all that are waiting).
    after_batch(conn): runs after each batch, once the flushes it finished are told (housekeeping).
    An exception from write_batch or after_batch ends the thread: catch inside them to go on."""

    def __init__(
        self,
        name: str,
        write_batch: Callable[[sqlite3.Connection, list], None],
        *,
        queue_size: int = 0,
        max_batch: int | None = None,
        after_batch: Callable[[sqlite3.Connection], None] | None = None,
    ):
        self.name = name
        self._write_batch = write_batch
        self._max_batch = max_batch
        self._after_batch = after_batch
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None

    def start(self, conn: sqlite3.Connection) -> None:
        """Start writing through `conn` (what was queued before is written first)."""
        self._thread = threading.Thread(
            target=self._write_loop, args=(conn,), name=f"tandem-{self.name}-writer", daemon=True
        )
        self._thread.start()

    def put(self, item) -> None:
        """Queue an item; waits while a bounded queue is full."""
        self._queue.put(item)

    def offer(self, item) -> bool:
        """Queue an item unless a bounded queue is full (False: it was not queued); never waits."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        return True

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until everything queued so far is written."""
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(timeout_s):
            raise TimeoutError(f"the {self.name} writer did not catch up")

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, then stop the thread (which closes the connection)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                items = [self._queue.get()]
                while self._max_batch is None or len(items) < self._max_batch:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                batch = [item for item in items if item is not _STOP and not isinstance(item, threading.Event)]
                if batch:
                    self._write_batch(conn, batch)
                for item in items:
                    if isinstance(item, threading.Event):
                        item.set()
                if self._after_batch is not None:
                    self._after_batch(conn)
                if any(item is _STOP for item in items):
                    return
        finally:
            conn.close()
