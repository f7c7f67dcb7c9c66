"""The traffic record of a `tandem serve`: routed requests into SQLite (or, with `state_db`, the
state database the replicas share: sdk.traffic.stores), off the request path.

    record = TrafficRecord(TrafficConfig(path="traffic.sqlite3")).start()
    record.record(entry)                          # from the event loop: never blocks, never raises
    status = record.feedback(response_id, key_fingerprint, score=1.0)
    record.close()                                # drains what is queued

One writer thread owns the connection that writes; requests reach it through a bounded
queue (full: the row is dropped and counted, serving never waits). The writer embeds the
prompts it stores with MiniLM (the router's topic directions come from them) and then
forgets the text unless `record_text` is on. Privacy-flagged requests (the private flag,
or any privacy rule matched, redacted or not) are only counted. Rows older than the
retention go hourly; past the size bound the oldest go first.

Feedback needs to know who a response was issued to before its row is written, so the last
OWNERS_KEPT response ids are kept in memory with their key fingerprint and tier (nothing
else); older ones are looked up in the file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from sdk.sqlite_writer import SQLiteWriter
from sdk.traffic.entry import TrafficEntry, entry_row
from sdk.traffic import store
from sdk.traffic.stores import connect, described, is_database

logger = logging.getLogger("tandem.traffic")

OWNERS_KEPT = 100_000
MAINTENANCE_EVERY_S = 3600.0
MAX_BATCH = 256  # items per batch (one transaction, its prompts embedded first) at most: a burst goes in several


@dataclass(frozen=True)
class TrafficConfig:
    path: str  # the SQLite file (created 0600), or the state database's postgresql:// URL (sdk.traffic.stores)
    record_text: bool = False  # also store prompt and answer text (off: features and signals only)
    retention_days: float = 30.0  # rows older than this are deleted
    max_mb: float = 512.0  # past this size the oldest rows are deleted
    embed: bool = True  # store a MiniLM embedding of each prompt (what routers learn topics from)
    queue_size: int = 10_000  # rows waiting for the writer; one more is dropped (and counted)

    def __post_init__(self):
        if not self.retention_days > 0 or not self.max_mb > 0 or self.queue_size < 1:
            raise ValueError("traffic retention_days and max_mb must be > 0 and queue_size >= 1")


class FeedbackError(Exception):
    """Feedback that cannot be taken: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class _Label:
    response_id: str
    source: str
    weak: float | None
    strong: float | None
    detail: str


class TrafficRecord:
    def __init__(self, config: TrafficConfig, embedder_factory=None):
        self.config = config
        self._embedder_factory = embedder_factory  # () -> Embedder-like; None: router.prompt_router.embeddings.Embedder
        self._embedder = None
        self._embed_failed = False
        self._writer = SQLiteWriter(
            "traffic",
            self._write,
            queue_size=config.queue_size,
            max_batch=MAX_BATCH,
            after_batch=self._maintain_when_due,
        )
        self._owners: OrderedDict[str, tuple[str | None, str, bool]] = OrderedDict()
        self._owners_lock = threading.Lock()
        self._reader = None
        self._reader_lock = threading.Lock()
        self.num_recorded = self.num_dropped = self.num_flagged = self.num_labels = 0  # since start, for /metrics
        self._dropped_lock = threading.Lock()
        self._dropped_unsaved = 0  # drops the file's counters do not have yet
        self._last_maintenance = 0.0

    @property
    def shared(self) -> bool:
        """Whether other replicas write this record too (it is in the state database)."""
        return is_database(self.config.path)

    # ---------------------------------------------------------------- life cycle

    def start(self) -> TrafficRecord:
        """Open (creating or migrating) the file and start the writer; raises if the file is unusable."""
        writer = connect(self.config.path)
        self._reader = connect(self.config.path)
        self._maintain(writer)
        self._writer.start(writer)
        logger.info(
            "recording routed traffic to %s (text %s, retention %g days, at most %g MB)",
            described(self.config.path),
            "kept" if self.config.record_text else "not kept",
            self.config.retention_days,
            self.config.max_mb,
        )
        return self

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until everything queued so far is written."""
        self._writer.flush(timeout_s)

    def close(self) -> None:
        self._writer.close(timeout_s=60)
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    # ---------------------------------------------------------------- writes

    def record(self, entry: TrafficEntry) -> None:
        """Queue one request (never blocks; a full queue drops it, counted)."""
        tier = getattr(entry.routing, "tier", "local")
        with self._owners_lock:
            self._owners[entry.response_id] = (entry.key_fingerprint, tier, entry.flagged_private)
            while len(self._owners) > OWNERS_KEPT:
                self._owners.popitem(last=False)
        self._put(entry)

    def judgment(self, response_id: str, weak: float | None, strong: float | None, detail: str) -> None:
        """A shadow judgment of both tiers' answers (sdk.traffic.shadow)."""
        self._put(_Label(response_id, "shadow", weak, strong, detail))

    def feedback(self, response_id: str, key_fingerprint: str | None, score: float, detail: str = "score") -> dict:
        """Feedback on a response issued to the same key: `score` in [0, 1] says how right the
        answer was, which labels the tier that gave it. FeedbackError(404) for an id never
        recorded, (403) for another key's response. A privacy-flagged response is answered but
        not stored. Repeats replace the earlier feedback (one per response)."""
        known = self._owner(response_id)
        if known is None:
            raise FeedbackError(
                404, f"no recorded response has id {response_id!r} (it may be older than the retention, or unrouted)"
            )
        owner, tier, flagged = known
        if owner != key_fingerprint:
            raise FeedbackError(403, f"response {response_id!r} was not issued to this API key")
        if flagged:
            self.count("feedback_on_private")
            return {"recorded": False, "reason": "privacy"}
        weak, strong = (score, None) if tier == "local" else (None, score)
        self._put(_Label(response_id, "feedback", weak, strong, detail))
        return {"recorded": True, "tier": tier}

    def count(self, name: str, amount: int = 1) -> None:
        """Add to today's counter `name` in the file (what is deliberately not stored row by row)."""
        self._put(("counter", name, amount))

    def counter_today(self, name: str) -> int:
        """Today's value of a counter as the file has it (what is still queued not included)."""
        if self._reader is None:
            return 0
        with self._reader_lock:
            return store.counter_today(self._reader, name)

    def num_label_rows(self) -> int:
        """Labels in the file (feedback and judgments; one per response and source)."""
        if self._reader is None:
            return 0
        with self._reader_lock:
            return int(self._reader.execute("SELECT count(*) FROM labels").fetchone()[0])

    def _owner(self, response_id: str) -> tuple[str | None, str, bool] | None:
        with self._owners_lock:
            if response_id in self._owners:
                return self._owners[response_id]
        if self._reader is None:
            return None
        with self._reader_lock:
            found, owner, tier = store.owner_of(self._reader, response_id)
        return (owner, tier, False) if found else None

    def _put(self, item) -> None:
        if not self._writer.offer(item):  # the writer is behind: serving never waits for it
            with self._dropped_lock:
                self.num_dropped += 1
                self._dropped_unsaved += 1

    # ---------------------------------------------------------------- the writer thread

    def _write(self, conn, items: list) -> None:
        """One transaction for a batch, applied in arrival order: a label may follow its request in the same batch."""
        # Embedding happens before the transaction: the file stays unlocked meanwhile.
        rows = {
            id(item): self._row(item) for item in items if isinstance(item, TrafficEntry) and not item.flagged_private
        }
        stored = labelled = flagged = 0
        try:
            with store.transaction(conn):
                for item in items:
                    if isinstance(item, TrafficEntry):
                        if item.flagged_private:
                            store.bump_counter(conn, "privacy_flagged")
                            flagged += 1
                        else:
                            store.insert_request(conn, rows[id(item)])
                            stored += 1
                    elif isinstance(item, _Label):
                        labelled += store.upsert_label(
                            conn, item.response_id, item.source, item.weak, item.strong, item.detail
                        )
                    elif isinstance(item, tuple) and item[0] == "counter":
                        store.bump_counter(conn, item[1], item[2])
                with self._dropped_lock:
                    dropped, self._dropped_unsaved = self._dropped_unsaved, 0
                if dropped:
                    store.bump_counter(conn, "dropped", dropped)
            self.num_recorded += stored
            self.num_labels += labelled
            self.num_flagged += flagged
        except Exception:  # a full disk, a locked file, a database away: serving goes on, the rows are lost (logged)
            logger.exception("the traffic record could not write %d rows", len(items))

    def _row(self, entry: TrafficEntry) -> dict:
        embedding, embedder = entry.embedding, entry.embedder
        if embedding is None and self.config.embed:
            embedding, embedder = self._embed(entry.prompt_text)
        return entry_row(entry, embedding, embedder, keep_text=self.config.record_text)

    def _embed(self, text: str) -> tuple[np.ndarray | None, str | None]:
        if self._embed_failed:
            return None, None
        try:
            if self._embedder is None:
                if self._embedder_factory is None:
                    from router.prompt_router.embeddings import Embedder

                    self._embedder_factory = Embedder
                self._embedder = self._embedder_factory()
            return self._embedder([text])[0], self._embedder.fingerprint
        except Exception:  # no export possible here (no torch), a broken cache: record without vectors
            logger.exception("traffic record: cannot embed prompts; rows are stored without embeddings")
            self._embed_failed = True
            return None, None

    def _maintain_when_due(self, conn) -> None:
        if time.monotonic() - self._last_maintenance > MAINTENANCE_EVERY_S:
            self._maintain(conn)

    def _maintain(self, conn) -> None:
        self._last_maintenance = time.monotonic()
        try:
            expired = store.delete_older_than(conn, time.time() - self.config.retention_days * 86400)
            trimmed = store.enforce_size(conn, int(self.config.max_mb * 1024 * 1024))
            if expired or trimmed:
                logger.info(
                    "traffic record: deleted %d rows past retention and %d over the size bound", expired, trimmed
                )
        except Exception:
            logger.exception("traffic record maintenance failed")
