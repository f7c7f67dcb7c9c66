"""The traffic record's operations (sdk.traffic.store, rows, table), the same on a SQLite file and on the state
database (tests/traffic/conftest.py runs each test on both): a row comes back column for column through the
record's row mapping, labels and counters, retention, the size bound and purge, and what training and
calibration read. What only one backend does (a file's mode and its free pages; replicas sharing the
database) is tested beside it: tests/traffic/test_record.py and test_shared_record.py."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from sdk.state.declaration import named_row, named_rows
from sdk.state.tables.traffic import REQUESTS
from sdk.traffic import store, stores
from sdk.traffic.rows import load_traffic_rows
from sdk.traffic.table import traffic_table
from tests.traffic.helpers import HashEmbedder, entry, open_record


@pytest.fixture
def conn(record_target):
    connection = stores.connect(record_target)
    assert isinstance(connection, store.RecordConnection)  # what the record's operations are written against
    yield connection
    connection.close()


def full_row(response_id: str, created_at: float = 1000.0, key: str = "fp-a") -> dict:
    """A requests row with every declared column set."""
    values = {"id": response_id, "created_at": created_at, "key_fingerprint": key, "escalated": 1}
    for column in REQUESTS.columns:
        if column.name in values:
            continue
        kind = column.type.name
        values[column.name] = {
            "TEXT": f"{column.name}-é",
            "REAL": 0.25,
            "INTEGER": 7,
            "BLOB": store.to_blob([1.5, -2]),
        }[kind]
    values["signals"] = {"min_logprob": -1.5}
    return values


def test_a_request_row_comes_back_column_for_column(conn):
    row = full_row("chatcmpl-1")
    store.insert_request(conn, row)
    read = named_row(conn.execute("SELECT * FROM requests WHERE id = ?", ("chatcmpl-1",)))
    assert list(read) == list(REQUESTS.column_names)  # the declared columns, in the declared order
    assert {**read, "signals": json.loads(read["signals"])} == row
    store.insert_request(conn, {**row, "tier": "cloud", "router": None})  # a repeated id replaces its columns
    assert store.owner_of(conn, "chatcmpl-1") == (True, "fp-a", "cloud")
    assert store.owner_of(conn, "chatcmpl-none") == (False, None, None)
    with pytest.raises(ValueError, match="not request columns"):
        store.insert_request(conn, {"id": "x", "region": "eu"})


def test_labels_replace_themselves_and_counters_add_up(conn):
    with store.transaction(conn):
        store.insert_request(conn, full_row("chatcmpl-1"))
    assert store.upsert_label(conn, "chatcmpl-1", "feedback", 1.0, None, "thumbs", created_at=5.0)
    assert store.upsert_label(conn, "chatcmpl-1", "feedback", 0.0, None, "score", created_at=6.0)  # replaces it
    assert not store.upsert_label(conn, "chatcmpl-none", "feedback", 1.0, None)  # not recorded: nothing kept
    labels = list(named_rows(conn.execute("SELECT * FROM labels")))
    assert labels == [
        {
            "response_id": "chatcmpl-1",
            "source": "feedback",
            "weak": 0.0,
            "strong": None,
            "created_at": 6.0,
            "detail": "score",
        }
    ]
    store.bump_counter(conn, "dropped", 2)
    store.bump_counter(conn, "dropped")
    assert store.counter_today(conn, "dropped") == 3 and store.counter_today(conn, "never") == 0


def test_retention_the_size_bound_and_purge_delete_the_oldest_and_their_labels(conn):
    for i in range(200):
        store.insert_request(
            conn, {**full_row(f"r{i:03d}", 1000.0 + i, key="fp-" + "ab"[i % 2] * 20), "embedding": bytes(4096)}
        )
    store.upsert_label(conn, "r010", "shadow", 1.0, 1.0)
    assert store.delete_older_than(conn, 1050.0) == 50
    assert conn.execute("SELECT count(*) FROM labels").fetchone()[0] == 0  # the label went with its row
    size = store.record_bytes(conn)
    deleted = store.enforce_size(conn, size // 2)
    assert 40 <= deleted < 120 and store.record_bytes(conn) <= size // 2 * store.SIZE_SLACK
    assert conn.execute("SELECT min(created_at) FROM requests").fetchone()[0] == 1050.0 + deleted  # oldest first
    left = store.stats(conn)["requests"]
    assert store.purge(conn, key_fingerprint="fp-" + "a" * 18) > 0  # the prefix of an id the logs show
    assert store.stats(conn)["requests"] < left
    assert store.purge(conn, everything=True) > 0 and store.stats(conn)["requests"] == 0
    with pytest.raises(ValueError):
        store.purge(conn)


def test_training_and_calibration_read_what_the_record_kept(record_target):
    record = open_record(record_target)
    for i in range(6):
        record.record(entry(f"chatcmpl-{i}", tier="local" if i % 2 == 0 else "cloud", text=f"prompt {i}"))
    record.flush()
    record.feedback("chatcmpl-0", "fp-a", 1.0)  # a local answer: a weak label
    for i in range(4):
        record.judgment(f"chatcmpl-{i}", float(i % 2), 1.0, "exact_match")
    record.flush()
    record.close()
    loaded = load_traffic_rows(record_target, embedder=HashEmbedder.fingerprint)
    assert loaded.ids == [f"chatcmpl-{i}" for i in range(6)] and loaded.num_labelled == 4
    np.testing.assert_allclose(loaded.rows.labels[0], [0.5, 1.0])  # feedback and judgment averaged
    np.testing.assert_allclose(loaded.rows.embedding[3], HashEmbedder()(["prompt 3"])[0])
    assert loaded.labelled_at[0] <= time.time() and np.isnan(loaded.labelled_at[5])
    table = traffic_table(record_target)
    assert [example.prompt for example in table.examples] == [f"chatcmpl-{i}" for i in range(4)]
    assert [example.weak_correct for example in table.examples] == [True, True, False, True]  # 0: mean 0.5
    assert table.examples[0].strong_correct and table.examples[0].extra["local_prompt_tokens"] == 12
