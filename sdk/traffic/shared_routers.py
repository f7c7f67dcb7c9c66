"""Retraining when replicas share one traffic record (`state_db`): one of them retrains, all of
them serve what it swaps in.

Which replica retrains: the one holding the retrain lock, a PostgreSQL session advisory lock
taken on a connection of its own. Every replica with [traffic] retrain on asks for it at each
check (sdk.traffic.retrain.BackgroundRetrainer); one gets it and keeps it while its connection
lives. When that replica stops or dies its connection closes, the lock is free, and the next
replica to check takes it over: no election to run, no lease to tune.

How the others pick up its router: a router it swaps in is stored, as the ONNX file's bytes, in
`tandem_traffic.routers`; at each check every replica loads the newest one it has not seen yet
(written under its own router_dir first, as a swap there writes it) and swaps it in as the
retrainer does its own. A replica that starts later adopts the newest at its first check.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sdk.state.connection import connect
from sdk.state.declaration import named_row
from sdk.state.redaction import redacted
from sdk.state.tables.traffic import ROUTERS

logger = logging.getLogger("tandem.traffic")

RETRAIN_LOCK = 7_301_154_912  # any constant, the same in every replica (the migration lock's neighbour)


class SharedRouters:
    """The retrain lock and the routers table of the state database at `url` (synchronous: call from a thread)."""

    def __init__(self, url: str, replica: str):
        self.url = url
        self.replica = replica
        self.last_seen = 0  # the newest router id this replica serves or has passed over
        self._lock_conn = None  # holds the retrain lock while this replica leads

    def _connect(self):
        return connect(self.url)  # the state database's options (sdk.state.connection)

    def leads(self) -> bool:
        """Whether this replica runs the retrains (holds the lock, taking it if it is free)."""
        if self._lock_conn is not None:
            try:
                self._lock_conn.execute("SELECT 1")  # a database that restarted dropped the lock with the session
                return True
            except Exception:
                self._drop_lock()
        conn = self._connect()
        if conn.execute("SELECT pg_try_advisory_lock(%s)", (RETRAIN_LOCK,)).fetchone()[0]:
            self._lock_conn = conn
            logger.info("this replica (%s) runs the router retrains of %s", self.replica, redacted(self.url))
            return True
        conn.close()
        return False

    def publish(self, path: str, detail: str) -> int:
        """Store the router this replica just swapped in, for the others; returns its id."""
        onnx = Path(path).read_bytes()
        with self._connect() as conn:
            (router_id,) = conn.execute(
                f"INSERT INTO {ROUTERS.postgres} (name, replica, detail, onnx) VALUES (%s, %s, %s, %s) RETURNING id",
                (os.path.basename(path), self.replica, detail, onnx),
            ).fetchone()
        self.last_seen = max(self.last_seen, router_id)
        return router_id

    def newest_unseen(self) -> tuple[int, str, bytes] | None:
        """(id, file name, ONNX bytes) of the newest stored router this replica has not seen, else None."""
        with self._connect() as conn:
            row = named_row(
                conn.execute(
                    f"SELECT id, name, onnx FROM {ROUTERS.postgres} WHERE id > %s ORDER BY id DESC LIMIT 1",
                    (self.last_seen,),
                )
            )
        return None if row is None else (int(row["id"]), str(row["name"]), bytes(row["onnx"]))

    def save(self, name: str, onnx: bytes, router_dir: str) -> str:
        """Write a stored router under `router_dir` (aside, then renamed: a reader sees it whole); its path."""
        os.makedirs(router_dir, mode=0o700, exist_ok=True)
        path = Path(router_dir) / os.path.basename(name)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(onnx)
        os.replace(partial, path)
        return str(path)

    def _drop_lock(self) -> None:
        if self._lock_conn is not None:
            try:
                self._lock_conn.close()
            except Exception:
                pass
            self._lock_conn = None

    def close(self) -> None:
        """Let go of the lock (another replica takes over at its next check)."""
        self._drop_lock()
