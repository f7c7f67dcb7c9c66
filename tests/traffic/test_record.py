"""The traffic record (sdk.traffic): what it stores and what it never does, feedback's
ownership rules, retention, the size bound, purge, schema migrations, and the rows a
router trains on. Real SQLite files in tmp_path; a hash embedder stands in for MiniLM."""

from __future__ import annotations

import os
import sqlite3
import stat
import time

import numpy as np
import pytest

from router.prompt_router.prompt_shape import NUM_SHAPE_FEATURES
from sdk.traffic import schema, store
from sdk.traffic.record import FeedbackError
from sdk.traffic.rows import load_traffic_rows
from tests.traffic.helpers import HashEmbedder, entry, open_record


def rows_of(path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM requests ORDER BY created_at").fetchall()
    finally:
        conn.close()


def test_rows_hold_features_and_signals_but_never_text(tmp_path):
    path = tmp_path / "deep" / "traffic.sqlite3"
    record = open_record(path)
    record.record(entry("chatcmpl-1", text="My secret plan is 42"))
    record.flush()
    record.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    [row] = rows_of(path)
    assert (row["id"], row["key_fingerprint"], row["tier"], row["reason"]) == (
        "chatcmpl-1",
        "fp-a",
        "local",
        "confident",
    )
    assert row["prompt_text"] is None and row["answer_text"] is None
    assert b"secret" not in path.read_bytes()  # nowhere in the file, not even in a free page
    assert len(store.from_blob(row["shape"])) == NUM_SHAPE_FEATURES and len(store.from_blob(row["embedding"])) == 384
    assert (
        row["embedder"] == HashEmbedder.fingerprint
        and row["local_completion_tokens"] == 5
        and row["latency_ms"] == 12.5
    )
    texted = open_record(tmp_path / "texted.sqlite3", record_text=True)
    texted.record(entry("chatcmpl-2", text="keep me"))
    texted.flush()
    texted.close()
    assert rows_of(tmp_path / "texted.sqlite3")[0]["prompt_text"] == "keep me"


def test_privacy_flagged_requests_are_only_counted(tmp_path):
    path = tmp_path / "traffic.sqlite3"
    record = open_record(path, record_text=True)
    record.record(entry("chatcmpl-private", private=True, text="jane.doe@example.com owes me"))
    record.record(entry("chatcmpl-open"))
    record.flush()
    assert [row["id"] for row in rows_of(path)] == ["chatcmpl-open"]
    assert b"jane.doe" not in path.read_bytes()
    assert record.counter_today("privacy_flagged") == 1 and record.num_flagged == 1
    # Feedback on it is answered, and stores nothing.
    assert record.feedback("chatcmpl-private", "fp-a", 1.0) == {"recorded": False, "reason": "privacy"}
    record.flush()
    assert record.num_label_rows() == 0
    record.close()


def test_feedback_belongs_to_the_key_that_got_the_answer(tmp_path):
    path = tmp_path / "traffic.sqlite3"
    record = open_record(path)
    record.record(entry("chatcmpl-a", key="fp-a"))
    record.record(entry("chatcmpl-cloud", key="fp-a", tier="cloud"))
    # Before the writer has the row: the owner is known in memory.
    assert record.feedback("chatcmpl-a", "fp-a", 0.0) == {"recorded": True, "tier": "local"}
    with pytest.raises(FeedbackError) as other:
        record.feedback("chatcmpl-a", "fp-b", 1.0)
    assert other.value.status == 403
    with pytest.raises(FeedbackError) as unknown:
        record.feedback("chatcmpl-nope", "fp-a", 1.0)
    assert unknown.value.status == 404
    record.feedback("chatcmpl-a", "fp-a", 1.0, "thumbs")  # a second verdict replaces the first
    record.feedback("chatcmpl-cloud", "fp-a", 0.25)
    record.flush()
    record.close()
    conn = sqlite3.connect(path)
    labels = conn.execute(
        "SELECT response_id, source, weak, strong, detail FROM labels ORDER BY response_id"
    ).fetchall()
    assert labels == [
        ("chatcmpl-a", "feedback", 1.0, None, "thumbs"),
        ("chatcmpl-cloud", "feedback", None, 0.25, "score"),
    ]
    # A restarted server (nothing in memory) finds owners in the file.
    again = open_record(path)
    with pytest.raises(FeedbackError) as later:
        again.feedback("chatcmpl-a", "fp-b", 1.0)
    assert later.value.status == 403 and again.feedback("chatcmpl-a", "fp-a", 0.5)["recorded"]
    again.close()


def test_a_label_in_the_same_batch_as_its_request_is_kept(tmp_path):
    """The writer applies a batch in arrival order (labels used to be applied before the batch's requests, and lost)."""
    from sdk.traffic.record import TrafficConfig, TrafficRecord

    record = TrafficRecord(TrafficConfig(str(tmp_path / "t.sqlite3")), embedder_factory=HashEmbedder)
    record.record(entry("chatcmpl-1"))  # not started: both wait in the queue and go in one batch
    record.feedback("chatcmpl-1", "fp-a", 1.0)
    record.judgment("chatcmpl-1", 1.0, 1.0, "exact_match")
    record.start()
    record.flush()
    assert record.num_label_rows() == 2 and record.num_labels == 2 and record.num_recorded == 1
    record.close()


def test_retention_size_bound_and_purge(tmp_path):
    path = tmp_path / "traffic.sqlite3"
    record = open_record(path, retention_days=1.0, max_mb=1.0)
    old = entry("chatcmpl-old")
    old.created_at = time.time() - 3 * 86400
    record.record(old)
    for i in range(400):
        record.record(entry(f"chatcmpl-{i:04d}", key="fp-a" if i % 2 else "fp-b", text=f"question {i} " + "x" * 2000))
    record.flush()
    record.close()
    conn = store.connect(path)
    try:
        assert store.delete_older_than(conn, time.time() - 86400) == 1
        before = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
        assert store.record_bytes(conn) < 1024 * 1024  # texts are not stored: 400 rows are small
        removed = store.enforce_size(conn, 64 * 1024)  # a tighter bound: the oldest rows go first
        remaining = [r[0] for r in conn.execute("SELECT id FROM requests ORDER BY created_at")]
        assert (
            removed > 0
            and len(remaining) == before - removed
            and store.record_bytes(conn) <= 64 * 1024 * store.SIZE_SLACK
        )
        assert remaining[-1] == "chatcmpl-0399" and "chatcmpl-0000" not in remaining
        deleted = store.purge(conn, key_fingerprint="fp-b")
        assert (
            deleted > 0
            and conn.execute("SELECT count(*) FROM requests WHERE key_fingerprint = 'fp-b'").fetchone()[0] == 0
        )
        store.purge(conn, everything=True)
        assert store.stats(conn)["requests"] == 0
        with pytest.raises(ValueError):
            store.purge(conn)
    finally:
        conn.close()


def test_a_full_queue_drops_rows_and_counts_them(tmp_path):
    from sdk.traffic.record import TrafficConfig, TrafficRecord

    record = TrafficRecord(TrafficConfig(str(tmp_path / "t.sqlite3"), queue_size=2, embed=False))
    for i in range(5):  # not started: nothing drains the queue
        record.record(entry(f"chatcmpl-{i}"))
    assert record.num_dropped == 3
    record.start()
    record.flush()
    assert record.counter_today("dropped") == 3 and len(rows_of(tmp_path / "t.sqlite3")) == 2
    record.close()


def test_schema_migrates_forward_and_refuses_what_it_cannot_read(tmp_path):
    path = tmp_path / "t.sqlite3"
    conn = store.connect(path)
    store.insert_request(
        conn, {"id": "r1", "created_at": 1.0, "model": "auto", "tier": "local", "escalated": 0, "reason": "x"}
    )
    assert schema.schema_version(conn) == schema.SCHEMA_VERSION
    # A later version adds a column: the row survives the migration.
    later = schema.MIGRATIONS + ["ALTER TABLE requests ADD COLUMN region TEXT; -- a new column"]
    assert schema.migrate(conn, later) == 2
    assert conn.execute("SELECT id, region FROM requests").fetchall() == [("r1", None)]
    conn.close()
    with pytest.raises(schema.TrafficSchemaError, match="newer than this tandem"):
        store.connect(path)  # written by the "later" tandem
    broken = [*schema.MIGRATIONS, "CREATE TABLE half (x); THIS IS NOT SQL"]
    fresh = sqlite3.connect(tmp_path / "fresh.sqlite3", isolation_level=None)
    with pytest.raises(sqlite3.OperationalError):
        schema.migrate(fresh, broken)
    assert schema.schema_version(fresh) == 1  # the failed step rolled back whole
    assert "half" not in {r[0] for r in fresh.execute("SELECT name FROM sqlite_master")}
    other = sqlite3.connect(tmp_path / "other.sqlite3")
    other.execute("CREATE TABLE users (name TEXT)")
    other.commit()
    other.close()
    with pytest.raises(schema.TrafficSchemaError, match="not a traffic record"):
        store.connect(tmp_path / "other.sqlite3")


def test_training_rows_combine_labels_and_skip_foreign_vectors(tmp_path):
    path = tmp_path / "traffic.sqlite3"
    record = open_record(path)
    for i in range(6):
        record.record(entry(f"chatcmpl-{i}", tier="local" if i % 2 == 0 else "cloud", text=f"prompt {i}"))
    record.flush()
    record.feedback("chatcmpl-0", "fp-a", 1.0)  # local answer: a weak label
    record.feedback("chatcmpl-1", "fp-a", 0.0)  # cloud answer: a strong label
    record.judgment("chatcmpl-0", 0.0, 1.0, "exact_match")  # shadow: both (weak averaged with the feedback)
    record.flush()
    record.close()
    loaded = load_traffic_rows(path, embedder=HashEmbedder.fingerprint)
    assert loaded.ids == [f"chatcmpl-{i}" for i in range(6)] and loaded.num_labelled == 2
    np.testing.assert_allclose(loaded.rows.labels[0], [0.5, 1.0])
    assert (
        np.isnan(loaded.rows.labels[1, 0])
        and loaded.rows.labels[1, 1] == 0.0
        and np.isnan(loaded.rows.labels[2:]).all()
    )
    assert np.isfinite(loaded.rows.embedding).all() and loaded.rows.shape.shape == (6, NUM_SHAPE_FEATURES)
    other = load_traffic_rows(path, embedder="another-embedder|int8")  # vectors of another model never mix in
    assert np.isnan(other.rows.embedding).all()
