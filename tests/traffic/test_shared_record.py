"""The traffic record in the state database (`state_db`, sdk.traffic.postgres_store): replicas
write one record, feedback finds a response another replica answered, training and calibration
read it as they read a file, `tandem traffic` works on it, a broken connection is reopened, and
the shadow budget counts what every replica spent. A real PostgreSQL (tests/conftest.py). The record's
operations themselves run on both backends in tests/traffic/test_record_backends.py."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import psycopg
import pytest
from typer.testing import CliRunner

from sdk.cli.app import app
from sdk.state.database import StateDatabase
from sdk.traffic import postgres_store
from sdk.traffic.config import TrafficSettings
from sdk.traffic.learning import start_learning
from sdk.traffic.record import FeedbackError
from sdk.traffic.rows import load_traffic_rows
from sdk.traffic.schema import TrafficSchemaError
from sdk.traffic.shadow import DailyBudget
from sdk.traffic.table import traffic_table
from tests.traffic.helpers import HashEmbedder, entry, open_record


@pytest.fixture
def record_url(state_db_url) -> str:
    """A fresh database migrated by a replica that has since stopped (the tables stay)."""

    async def migrate():
        await (await StateDatabase(state_db_url).open()).close()

    asyncio.run(migrate())
    return state_db_url


def query(url: str, sql: str, params=()) -> list[tuple]:
    with psycopg.connect(url, options="-c search_path=tandem_traffic") as conn:
        return conn.execute(sql, params).fetchall()


def test_two_replicas_write_one_record_and_feedback_crosses_them(record_url):
    first, second = open_record(record_url), open_record(record_url)
    try:
        first.record(entry("chatcmpl-a", key="fp-a", text="My secret plan is 42"))
        second.record(entry("chatcmpl-b", key="fp-b", tier="cloud"))
        second.record(entry("chatcmpl-p", key="fp-b", private=True))
        first.flush()
        second.flush()
        rows = query(record_url, "SELECT id, key_fingerprint, tier, prompt_text, embedder FROM requests ORDER BY id")
        assert rows == [
            ("chatcmpl-a", "fp-a", "local", None, HashEmbedder.fingerprint),
            ("chatcmpl-b", "fp-b", "cloud", None, HashEmbedder.fingerprint),
        ]  # the private one is only counted; no text kept
        # Feedback reaches a replica that did not answer: the owner comes from the shared record.
        assert second.feedback("chatcmpl-a", "fp-a", 0.0) == {"recorded": True, "tier": "local"}
        with pytest.raises(FeedbackError) as other_key:
            second.feedback("chatcmpl-a", "fp-b", 1.0)
        assert other_key.value.status == 403
        with pytest.raises(FeedbackError) as unknown:
            first.feedback("chatcmpl-never", "fp-a", 1.0)
        assert unknown.value.status == 404
        first.feedback("chatcmpl-b", "fp-b", 1.0)
        second.feedback("chatcmpl-a", "fp-a", 1.0)  # a repeat replaces the earlier verdict
        first.count("shadow_cloud_tokens", 30)
        second.count("shadow_cloud_tokens", 12)
        first.flush()
        second.flush()
        labels = query(record_url, "SELECT response_id, source, weak, strong FROM labels ORDER BY response_id")
        assert labels == [("chatcmpl-a", "feedback", 1.0, None), ("chatcmpl-b", "feedback", None, 1.0)]
        assert first.counter_today("shadow_cloud_tokens") == second.counter_today("shadow_cloud_tokens") == 42
        assert first.counter_today("privacy_flagged") == 1 and first.num_label_rows() == 2
        assert first.shared and second.shared
    finally:
        first.close()
        second.close()


def test_training_calibration_and_the_cli_read_the_shared_record(record_url):
    record = open_record(record_url)
    for i in range(6):
        record.record(entry(f"chatcmpl-{i}", key="fp-a", text=f"question {i}"))
    record.flush()
    for i in range(6):
        record.judgment(f"chatcmpl-{i}", float(i % 2), 1.0, "exact_match")
    record.flush()
    record.close()
    traffic = load_traffic_rows(record_url, embedder=HashEmbedder.fingerprint)
    assert traffic.ids == [f"chatcmpl-{i}" for i in range(6)] and traffic.num_labelled == 6
    expected = HashEmbedder()(["question 3"])[0]
    np.testing.assert_allclose(traffic.rows.embedding[3], expected)  # the vector comes back as it went in
    assert traffic_table(record_url).examples[1].weak_correct  # i = 1: weak 1.0

    runner = CliRunner()
    stats = runner.invoke(app, ["traffic", "stats", "--path", record_url])
    assert stats.exit_code == 0, stats.output
    assert '"requests": 6' in stats.output and '"shadow": 6' in stats.output
    purged = runner.invoke(app, ["traffic", "purge", "--path", record_url, "--key-fingerprint", "fp-a"])
    assert purged.exit_code == 0 and "deleted 6 request rows" in purged.output
    assert query(record_url, "SELECT count(*) FROM labels") == [(0,)]  # the labels went with their rows


def test_a_broken_connection_is_reopened_and_only_its_batch_is_lost(record_url):
    record = open_record(record_url)
    try:
        record.record(entry("chatcmpl-1"))
        record.flush()
        # The database ends every session of this record (as a restart would).
        query(
            record_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        record.record(entry("chatcmpl-2"))  # this batch meets the dead connection
        record.flush()
        record.record(entry("chatcmpl-3"))
        record.flush()
        ids = [row[0] for row in query(record_url, "SELECT id FROM requests ORDER BY id")]
        assert ids[0] == "chatcmpl-1" and ids[-1] == "chatcmpl-3"
        assert record.counter_today("privacy_flagged") == 0  # the reader reopened too
    finally:
        record.close()


def test_a_record_needs_the_state_database_migrated_and_one_place_to_go(state_db_url, tmp_path):
    with pytest.raises(TrafficSchemaError, match="no traffic record yet"):
        postgres_store.connect(state_db_url)
    settings = TrafficSettings(record=True, path=str(tmp_path / "traffic.sqlite3"))
    with pytest.raises(ValueError, match=r"\[traffic\] path and state_db"):
        start_learning(settings, lambda: None, state=type("State", (), {"url": state_db_url})())


def test_the_shadow_budget_counts_what_every_replica_spent():
    day = time.time()
    budget = DailyBudget(1000, used_today=100, clock=lambda: day)
    assert budget.reserve(300)
    budget.count_shared(650)  # the other replicas settled more than this one knows
    assert budget.remaining == 1000 - 650 - 300
    budget.count_shared(200)  # a counter behind this replica's own settles does not lower them
    assert budget.remaining == 1000 - 650 - 300
