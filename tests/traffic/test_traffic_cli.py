"""`tandem traffic stats|purge`, `tandem router train --from-traffic` and `tandem calibrate
--from-traffic` on records written the way `tandem serve` writes them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from router.prompt_router.scorer import load_scorer
from sdk.cli.app import app
from sdk.traffic import store
from tests.traffic.test_retrain import PROMPTS, _fill


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_stats_and_purge(tmp_path):
    db = tmp_path / "traffic.sqlite3"
    _fill(db, 50, (0.5, 0.5))
    result = run("traffic", "stats", "--path", str(db))
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["requests"] == 50 and stats["labels"] == {"shadow": 50} and stats["with_text"] == 0
    assert run("traffic", "purge", "--path", str(db)).exit_code != 0  # says what to delete
    result = run("traffic", "purge", "--path", str(db), "--all")
    assert result.exit_code == 0 and "deleted 50" in result.output
    assert json.loads(run("traffic", "stats", "--path", str(db)).output)["requests"] == 0
    missing = run("traffic", "stats", "--path", str(tmp_path / "none.sqlite3"))
    assert missing.exit_code != 0 and "no traffic record" in missing.output


def test_calibrate_from_traffic_uses_the_judged_requests(tmp_path):
    db = tmp_path / "traffic.sqlite3"
    conn = store.connect(db)
    rng = np.random.default_rng(0)
    for i in range(200):  # a router score that knows which prompts the local tier gets wrong
        weak = float(rng.random() < 0.6)
        store.insert_request(
            conn,
            {
                "id": f"r{i}",
                "created_at": float(i),
                "model": "auto",
                "tier": "local",
                "escalated": 0,
                "reason": "confident",
                "router_score": float(0.7 - 0.4 * weak + 0.1 * rng.random()),
                "local_prompt_tokens": 20,
                "local_completion_tokens": 10,
            },
        )
        store.upsert_label(conn, f"r{i}", "shadow", weak, 1.0, "test")
    store.insert_request(
        conn,
        {"id": "feedback-only", "created_at": 300.0, "model": "auto", "tier": "local", "escalated": 0, "reason": "x"},
    )
    store.upsert_label(conn, "feedback-only", "feedback", 1.0, None, "score")  # one tier judged: not a calibration row
    conn.close()
    result = run(
        "calibrate",
        "--from-traffic",
        str(db),
        "--router",
        "column:router_score",
        "--higher-means",
        "cloud",
        "--quality",
        "0.95",
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    assert "on 200 prompts" in result.output and "dry run" in result.output
    both = run(
        "calibrate",
        "--from-traffic",
        str(db),
        "--data",
        "routellm",
        "--router",
        "column:router_score",
        "--quality",
        "0.9",
        "--dry-run",
    )
    assert both.exit_code != 0 and "one of --data" in both.output
    conn = store.connect(tmp_path / "unjudged.sqlite3")
    conn.close()
    empty = run(
        "calibrate",
        "--from-traffic",
        str(tmp_path / "unjudged.sqlite3"),
        "--router",
        "column:router_score",
        "--quality",
        "0.9",
    )
    assert empty.exit_code != 0 and "both tiers judged" in empty.output


@pytest.mark.slow
def test_router_train_from_traffic_refines_the_shipped_router(tmp_path):
    db = tmp_path / "traffic.sqlite3"
    _fill(db, 400, (0.1, 0.95))
    out = tmp_path / "learned.onnx"
    result = run("router", "train", "--from-traffic", str(db), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "400 rows, 400 with both tiers judged" in result.output and "topic correction from 400" in result.output
    learned, shipped = load_scorer(out), load_scorer()
    assert learned.metadata["topic_correction"]["num_rows"] == 400 and learned.has_embedder
    assert learned.metadata["prior_statistics"] == shipped.metadata["prior_statistics"]  # the public tables travel on
    assert np.abs(learned.score(PROMPTS) - shipped.score(PROMPTS)).max() > 0.01
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert report["num_table_rows"] == 0 and report["num_traffic_judged"] == 400
    assert (
        report["num_base_rows"]
        == shipped.metadata["prior_statistics"]["num_rows"]
        == sum(shipped.metrics["trained_on"].values())
    )
    assert (
        learned.metadata["head_recipe"] == shipped.metadata["head_recipe"]
    )  # the retrain keeps the base router's recipe
