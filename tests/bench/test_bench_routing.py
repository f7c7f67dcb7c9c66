"""bench.routing's sections on small inputs: the unseen-subject CV on a synthetic table
(prompt lengths that carry the label, so the trained head must beat random), and the
arithmetic section over the embedded local model (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.routing import arithmetic, probe_latency, strict, unseen_mmlu, write_plots
from router.eval_tables import RoutingExample
from router.evaluation.inputs import LoadedTable


def _synthetic_table(seed: int = 0) -> LoadedTable:
    """8 MMLU subjects x 40 rows + 40 GSM8K rows; the weak tier fails the long prompts full of
    arithmetic (the strong tier gets most right), whose length shows it (the shipped recipe,
    router.prompt_router.cold_recipe.DEFAULT, reads the length alone)."""
    rng = np.random.default_rng(seed)
    examples = []
    for index in range(360):
        source = "gsm8k" if index < 40 else f"mmlu_s{index % 8}"
        weak, strong = bool(rng.random() < 0.6), bool(rng.random() < 0.85)
        words = "word " * int(rng.integers(1, 15) if weak else rng.integers(15, 40))
        prompt = (
            f"{words} compute {index} * {index + 7} = ? and (3 + 4) / 2 = ?"
            if not weak
            else f"{words} tell me about {index}"
        )
        examples.append(RoutingExample(prompt, weak, strong or not weak, source))
    return LoadedTable(examples, 3, ["synthetic"])


def _assert_oracle_on_top(report: dict) -> None:
    oracle = report["routers"]["oracle"]["apgr"]
    for name, metrics in report["routers"].items():
        assert metrics["apgr"] <= oracle + 1e-9, name
        assert len(metrics["quality"]) == len(metrics["shares"]) == 11


def test_unseen_mmlu_section_on_a_synthetic_table(tmp_path):
    table = _synthetic_table()
    report = unseen_mmlu(table, folds=2, seeds=(0, 1), num_random_seeds=20)
    routers = report["routers"]
    assert list(routers) == ["prompt_router", "prompt_length", "random", "oracle"]
    assert report["num_prompts"] == 320 and report["num_train_only_prompts"] == 40  # GSM8K always trains
    assert report["num_subjects"] == 8 and report["num_dropped_contaminated"] == 3
    _assert_oracle_on_top(report)
    # The prompt length carries the label: a head trained on other subjects must beat random clearly.
    assert routers["prompt_router"]["apgr"] > 0.7 and abs(routers["random"]["apgr"] - 0.5) < 0.05
    assert set(routers["prompt_router"]["apgr_by_seed"]) == {"0", "1"}
    # The per-seed figures average to the reported one; the per-fold mean lies within the folds' range.
    entry = routers["prompt_router"]
    assert entry["apgr"] == pytest.approx(np.mean(list(entry["apgr_by_seed"].values())))
    assert (
        entry["apgr_fold_min"] <= entry["apgr_fold_mean"] <= entry["apgr_fold_max"] and entry["apgr_fold_mean_se"] > 0
    )
    # The plotted curve starts at the weak tier and ends at the strong tier (fold means).
    for metrics in routers.values():
        assert metrics["quality"][0] == pytest.approx(report["weak_acc"])
        assert metrics["quality"][-1] == pytest.approx(report["strong_acc"])
    json.dumps(strict(report), allow_nan=False)


@pytest.mark.slow
def test_arithmetic_section_plots_and_strict_json(tmp_path):
    from bench.confidence_auroc import collect_answers

    answers = collect_answers(40, seed=1)
    report, scored = arithmetic(answers, seed=1, num_random_seeds=20)
    assert report["strong_acc"] == 1.0 and "assumed" in report["strong_assumption"]
    assert report["num_prompts"] == scored.heldout.size == report["counts"]["heldout"]
    assert report["weak_acc"] == pytest.approx(answers.labels[scored.heldout].mean())
    assert {"probe", "random", "oracle"} <= set(report["routers"])
    assert "signal:" + report["best_signal"] in report["routers"] and len(report["routers"]) == 3 + len(
        scored.oriented_heldout
    )
    _assert_oracle_on_top(report)
    timing = probe_latency(scored.onnx_probe, answers.features[scored.heldout], warmup=2)
    assert 0.0 < timing["p50_ms"] < 50.0 and timing["count"] == scored.heldout.size

    mmlu_report = unseen_mmlu(_synthetic_table(), folds=2, seeds=(0,), num_random_seeds=5)
    paths = write_plots(tmp_path / "out" / "routing.json", mmlu_report, report)
    assert [p.name for p in paths] == ["routing_mmlu.png", "routing_arithmetic.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 5000 for p in paths)
    json.dumps(strict({"arithmetic": report, "unseen_mmlu": mmlu_report}), allow_nan=False)
