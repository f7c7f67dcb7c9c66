"""The locked-set report: APGR within each subject, then their mean, SE and range."""

from __future__ import annotations

import numpy as np
import pytest

from router.eval_tables import RoutingExample
from router.prompt_router.cross_validation import evaluate, per_subject_apgr


def _rows(subject: str, outcomes: list[tuple[bool, bool]]) -> list[RoutingExample]:
    return [RoutingExample(f"{subject} q{i}", weak, strong, subject) for i, (weak, strong) in enumerate(outcomes)]


def test_each_subject_is_scored_on_its_own_rows():
    # In "a" the cloud fixes rows 0-1; in "b" rows 2-3. One score vector that ranks a's fixable rows first.
    a = _rows("mmlu_a", [(False, True), (False, True), (True, True), (False, False)])
    b = _rows("mmlu_b", [(True, True), (False, False), (False, True), (False, True)])
    scores = np.array([0.9, 0.8, 0.1, 0.2, 0.1, 0.2, 0.9, 0.8])
    report = per_subject_apgr(scores, a + b)
    assert report["apgr_by_subject"]["mmlu_a"] == pytest.approx(evaluate(scores[:4], a)["apgr"])
    assert report["apgr_by_subject"]["mmlu_b"] == pytest.approx(evaluate(scores[4:], b)["apgr"])
    values = list(report["apgr_by_subject"].values())
    assert report["apgr_mean"] == pytest.approx(np.mean(values))
    assert report["apgr_min"] == min(values) and report["apgr_max"] == max(values) and report["num_subjects"] == 2


def test_a_subject_without_a_gap_is_named_not_averaged():
    a = _rows("mmlu_a", [(False, True), (True, True)])
    flat = _rows("mmlu_flat", [(True, True), (False, False)])  # both tiers equally accurate
    report = per_subject_apgr(np.array([0.9, 0.1, 0.5, 0.5]), a + flat)
    assert report["subjects_without_gap"] == ["mmlu_flat"] and list(report["apgr_by_subject"]) == ["mmlu_a"]


def test_locked_figures_pool_every_row_and_leave_each_subject_out_for_the_standard_error():
    from router.prompt_router.cross_validation import locked_figures

    rng = np.random.default_rng(0)
    examples = [
        e
        for s in range(5)
        for e in _rows(f"mmlu_{s}", [(bool(rng.random() < 0.5), bool(rng.random() < 0.8)) for _ in range(30)])
    ]
    scores, length = rng.random(len(examples)), rng.random(len(examples))
    figures = locked_figures(scores, length, examples)
    assert figures["apgr"] == pytest.approx(evaluate(scores, examples)["apgr"])
    assert figures["minus_length"] == pytest.approx(figures["apgr"] - evaluate(length, examples)["apgr"])
    left_out = np.array(
        [
            evaluate(scores[np.arange(150) // 30 != s], [e for i, e in enumerate(examples) if i // 30 != s])["apgr"]
            for s in range(5)
        ]
    )
    assert figures["apgr_se"] == pytest.approx(np.sqrt(4 / 5 * ((left_out - left_out.mean()) ** 2).sum()))
    same = locked_figures(scores, scores, examples)
    assert same["minus_length"] == 0 and same["minus_length_se"] == 0 and not same["beats_length"]
    assert figures["num_subjects"] == 5 and figures["per_subject"]["num_subjects"] <= 5
