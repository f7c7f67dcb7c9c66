"""bench.router_learning on a synthetic table: labels arrive as the product would get them,
every method scores the rest of the stream, the summary and plot come out. The synthetic
subjects differ in difficulty by topic (their embeddings' cluster), which the prompt shape
does not show, so learning from labels has something to find."""

from __future__ import annotations

import numpy as np
import pytest

from bench.router_learning import plot, zero_shot
from bench.router_simulation import METHODS, Traffic, labels_to_reach, revealed_labels, simulate, summarize_runs
from router.eval_tables import RoutingExample
from router.prompt_router.training import fit, table_rows


def _table(num_subjects: int = 16, per_subject: int = 200, seed: int = 0) -> tuple[list[RoutingExample], np.ndarray]:
    rng = np.random.default_rng(seed)
    examples, rows = [], []
    centres = rng.normal(size=(num_subjects, 384))
    for s in range(num_subjects):
        weak_rate = 0.2 + 0.6 * (s % 4) / 3  # topic difficulty the shape cannot see
        for i in range(per_subject):
            long = i % 2 == 0
            prompt = ("word " * (40 if long else 5)) + f"{s}-{i}?"
            weak = bool(rng.random() < weak_rate * (0.7 if long else 1.0))
            examples.append(RoutingExample(prompt, weak, bool(rng.random() < 0.9), f"mmlu_s{s}"))
            rows.append(centres[s] + 0.5 * rng.normal(size=384))
    embeddings = np.array(rows, dtype=np.float32)
    return examples, embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)


def test_labels_arrive_as_the_product_learns_them():
    examples, _ = _table()
    rows = table_rows(examples)
    cold, _ = fit(rows, None)
    rng = np.random.default_rng(0)
    gain = cold.predict(rows.shape) @ np.array([-1.0, 1.0])
    cut = (gain.min() + gain.max()) / 2  # the table's long prompts go to the cloud, the short ones stay local
    labels = revealed_labels(rows, cold, cut=cut, traffic=Traffic(feedback=0.3, shadow=0.2, judge="best_case"), rng=rng)
    cloud = gain >= cut
    both = ~np.isnan(labels).any(1)
    assert (
        both.any() and not (both & cloud).any()
    )  # shadow sampling judges both tiers only for locally answered requests
    assert np.isnan(labels[cloud, 0]).all()  # feedback on a cloud answer says nothing of the local tier
    known = ~np.isnan(labels)
    np.testing.assert_array_equal(labels[known], rows.labels[known])  # a best-case judge reveals the truth
    assert 0.2 < (~np.isnan(labels).all(1)).mean() < 0.6
    silent = revealed_labels(rows, cold, cut=cut, traffic=Traffic(feedback=0.0, shadow=0.0), rng=rng)
    assert np.isnan(silent).all()


def test_the_shipped_judge_labels_the_local_answer_by_agreement_with_the_cloud():
    """exact_match (sdk.traffic.judges): a shadow sample labels the local tier only, right when its
    final answer matches the cloud's: wrong whenever exactly one tier was right."""
    examples, _ = _table()
    rows = table_rows(examples)
    cold, _ = fit(rows, None)
    gain = cold.predict(rows.shape) @ np.array([-1.0, 1.0])
    cut = (gain.min() + gain.max()) / 2
    labels = revealed_labels(
        rows, cold, cut=cut, traffic=Traffic(feedback=0.0, shadow=1.0), rng=np.random.default_rng(0)
    )
    local = gain < cut
    assert np.isnan(labels[:, 1]).all() and not np.isnan(labels[local, 0]).any()
    weak, strong = rows.labels[:, 0] > 0.5, rows.labels[:, 1] > 0.5
    assert (labels[local & weak & strong, 0] == 1).all() and (labels[local & (weak != strong), 0] == 0).all()
    both_wrong = labels[local & ~weak & ~strong, 0]
    assert 0.1 < both_wrong.mean() < 0.6  # both wrong: they agree on a wrong choice about one time in three


def test_simulation_scores_every_method_and_summarizes():
    examples, embeddings = _table()
    runs = [
        simulate(
            examples,
            embeddings,
            seed,
            Traffic(feedback=0.4, shadow=0.3, judge="best_case"),
            checkpoints=(0.0, 0.1, 0.3),
        )
        for seed in (0, 1)
    ]
    for run in runs:
        assert run[0.0]["num_labels"] == 0 and run[0.0]["position"] == 0
        assert len({run[0.0][name] for name in METHODS}) == 1  # no labels: every method is the cold router
        assert run[0.3]["num_labels"] >= 0.3 * 800 - 1
    curve = summarize_runs(runs)
    assert set(curve) == {"0", "0.1", "0.3"} and curve["0.1"]["num_seeds"] == 2
    for name in METHODS[1:]:
        assert {"apgr", "apgr_se", "minus_cold", "minus_cold_se"} <= set(curve["0.3"][name])
    # The topic difficulty is learnable: the oracle and the shipped method gain on the cold router.
    assert curve["0.3"]["subject_means_oracle"]["minus_cold"] > 0.03
    assert curve["0.3"]["shipped"]["minus_cold"] > 0.02
    assert labels_to_reach(curve, "cold", level=-1.0) == 0.0 and labels_to_reach(curve, "cold", level=2.0) is None


def test_zero_shot_pairs_every_recipe_with_prompt_length(tmp_path):
    examples, embeddings = _table()
    report = zero_shot(examples, embeddings, seeds=(0,))
    recipes = report["recipes"]
    assert set(recipes) == {
        "prompt_length",
        "selected_recipe",
        "shape_ridge_all_features",
        "shape_ridge_weak_wrong",
        "embedding_ridge_per_tier",
        "shape_and_embedding_ridge_per_tier",
    }
    assert len(recipes["prompt_length"]["apgr_by_fold"]) == 4 and "minus_prompt_length" not in recipes["prompt_length"]
    shipped = recipes["selected_recipe"]
    assert shipped["minus_prompt_length"] == pytest.approx(
        np.mean(np.subtract(shipped["apgr_by_fold"], recipes["prompt_length"]["apgr_by_fold"]))
    )
    runs = [simulate(examples, embeddings, 0, Traffic(feedback=0.4, shadow=0.3), checkpoints=(0.0, 0.1))]
    path = tmp_path / "curve.png"
    plot({"shuffled": summarize_runs(runs)}, path)
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000


def test_the_background_retrains_guard_keeps_the_cold_router_unless_the_learner_wins_on_the_newest_labels():
    from bench.router_simulation import guarded_fit
    from router.prompt_router.training import LabelledRows

    examples, embeddings = _table()
    order = np.random.default_rng(0).permutation(len(examples))  # traffic arrives shuffled: the newest span the topics
    examples, embeddings = [examples[i] for i in order], embeddings[order]
    rows = table_rows(examples)
    cold, _ = fit(rows, None)
    seen = LabelledRows(rows.shape, rows.labels.copy(), embeddings, rows.groups)
    head, correction = guarded_fit(rows, cold, seen)
    assert correction is not None  # topics the shape cannot see: the learner ranks the newest labels better, swapped in
    few = LabelledRows(seen.shape, np.full_like(seen.labels, np.nan), embeddings, rows.groups)
    few.labels[:50] = rows.labels[:50]
    kept = guarded_fit(rows, cold, few)
    assert kept[0] is cold and kept[1] is None  # too few labels for a holdout: nothing to go on
    cold_right = LabelledRows(seen.shape, rows.labels.copy(), embeddings, rows.groups)
    cold_right.labels[-100:] = np.clip(
        cold.predict(rows.shape[-100:]), 0, 1
    )  # the newest labels: exactly what cold predicts
    kept = guarded_fit(rows, cold, cold_right)
    assert kept[0] is cold and kept[1] is None
