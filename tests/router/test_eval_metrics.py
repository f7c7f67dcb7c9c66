"""RouteLLM's metrics against values computed by hand on a ten-prompt table.

The table (weak, strong): three prompts only the strong tier gets right (0, 1, 2), one only
the weak tier gets right (3), four both (4-7), two neither (8, 9): weak 0.5, strong 0.7.
Ten prompts make each decile exactly one prompt, so the hand computations below are sums
of 0.1-wide trapezoids.
"""

from __future__ import annotations

import numpy as np
import pytest

from router.eval_tables import RoutingExample
from router.evaluation.metrics import (
    Outcomes,
    evaluate_scores,
    exact_curve,
    oracle_scores,
    random_curve,
    share_to_reach,
    summarize,
)

WEAK = [0, 0, 0, 1, 1, 1, 1, 1, 0, 0]
STRONG = [1, 1, 1, 0, 1, 1, 1, 1, 0, 0]
# Routes 0 and 2 first (two gains), then 3 (a loss), prompt 1's gain only at the 9th place.
ROUTER = [0.9, 0.1, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.0]


def make_outcomes(weak=WEAK, strong=STRONG) -> Outcomes:
    return Outcomes.of([RoutingExample(f"p{i}", bool(w), bool(s), "t") for i, (w, s) in enumerate(zip(weak, strong))])


def test_a_router_by_hand():
    metrics = evaluate_scores(ROUTER, make_outcomes())
    # Cumulative gains 1, 2, 1, 1, 1, 1, 1, 1, 2, 2 over ten prompts.
    assert metrics.quality == pytest.approx([0.5, 0.6, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.7, 0.7])
    assert metrics.auc == pytest.approx(0.62)  # 0.1 * (6.8 - (0.5 + 0.7) / 2)
    assert metrics.apgr == pytest.approx(0.6)  # (0.62 - 0.5) / 0.2
    # Targets 0.54, 0.60, 0.66: reached inside the first, at the first, inside the second step.
    assert metrics.cpt == pytest.approx({"20%": 0.04, "50%": 0.1, "80%": 0.16})


def test_the_oracle_by_hand_beats_the_strong_tier():
    outcomes = make_outcomes()
    curve = exact_curve(oracle_scores(outcomes), outcomes)
    # Three gains tied at +1 (one group), six zeros, the loss last.
    assert curve.shares == pytest.approx([0, 0.3, 0.9, 1.0]) and curve.quality == pytest.approx([0.5, 0.8, 0.8, 0.7])
    metrics = summarize(curve, outcomes)
    assert metrics.auc == pytest.approx(0.75)  # 0.1 * (8.1 - 0.6)
    assert metrics.apgr == pytest.approx(1.25) and metrics.apgr >= 1  # a table where the weak tier wins some
    assert metrics.cpt == pytest.approx({"20%": 0.04, "50%": 0.1, "80%": 0.16})


def test_the_inverted_oracle_by_hand_is_worst_of_all():
    outcomes = make_outcomes()
    inverted = evaluate_scores(-oracle_scores(outcomes), outcomes)
    assert inverted.auc == pytest.approx(0.45) and inverted.apgr == pytest.approx(-0.25)
    assert inverted.cpt == pytest.approx({"20%": 0.84, "50%": 0.9, "80%": 0.96})
    others = [
        evaluate_scores(ROUTER, outcomes),
        evaluate_scores(oracle_scores(outcomes), outcomes),
        summarize(random_curve(outcomes, 100), outcomes),
        evaluate_scores(np.zeros(10), outcomes),
    ]
    assert all(inverted.apgr < other.apgr for other in others)


@pytest.mark.parametrize("table_seed", range(5))
def test_on_random_tables_the_oracle_bounds_every_router(table_seed):
    # The inverted oracle's exact curve is the lowest of all orders at every share (gains in
    # ascending order minimise every prefix sum), the oracle's the highest: no router escapes.
    rng = np.random.default_rng(table_seed)
    outcomes = make_outcomes(rng.random(60) < 0.5, rng.random(60) < 0.7)
    worst = evaluate_scores(-oracle_scores(outcomes), outcomes).auc
    best = evaluate_scores(oracle_scores(outcomes), outcomes).auc
    for router_seed in range(20):
        scores = rng.integers(0, 5, 60)  # coarse scores: plenty of ties
        assert worst - 1e-12 <= evaluate_scores(scores, outcomes).auc <= best + 1e-12


def test_the_random_router_recovers_half_the_gap():
    # Random orders have an expected curve that is exactly the straight line from weak to
    # strong, so E[APGR] = 0.5. The tolerance is 4 standard errors of the mean over the
    # seeds, measured from the seeds themselves; the seeds are fixed, so this never flakes.
    rng = np.random.default_rng(7)
    outcomes = make_outcomes(rng.random(300) < 0.6, rng.random(300) < 0.8)
    per_seed = [summarize(random_curve(outcomes, num_seeds=1, seed=seed), outcomes).apgr for seed in range(400)]
    tolerance = 4 * np.std(per_seed) / np.sqrt(len(per_seed))
    assert abs(np.mean(per_seed) - 0.5) < tolerance
    averaged = summarize(random_curve(outcomes, num_seeds=400), outcomes)
    assert abs(averaged.apgr - 0.5) < tolerance  # AUC is linear in the curve: the same mean
    assert averaged.cpt["50%"] == pytest.approx(0.5, abs=0.05)


def test_ties_are_routed_together_and_do_not_depend_on_row_order():
    outcomes = make_outcomes()
    flat = evaluate_scores(np.zeros(10), outcomes)  # one tie group: the straight line, APGR 0.5 exactly
    assert flat.quality == pytest.approx(np.linspace(0.5, 0.7, 11)) and flat.apgr == pytest.approx(0.5)
    scores = np.array([2, 2, 1, 1, 1, 0, 0, 0, 0, 0])
    curve = exact_curve(scores, outcomes)
    assert curve.shares == pytest.approx([0, 0.2, 0.5, 1.0])  # a point per group boundary only
    order = np.random.default_rng(0).permutation(10)
    shuffled = make_outcomes(np.array(WEAK)[order], np.array(STRONG)[order])
    assert evaluate_scores(scores[order], shuffled) == evaluate_scores(scores, outcomes)


def test_missing_scores_and_degenerate_tables():
    outcomes = make_outcomes()
    with pytest.raises(ValueError, match="NaN"):
        exact_curve([float("nan")] * 10, outcomes)
    with pytest.raises(ValueError, match="10 prompts"):
        exact_curve([0.0] * 3, outcomes)
    same = make_outcomes(WEAK, WEAK)  # no gap: APGR is undefined, every level is met at share 0
    metrics = evaluate_scores(ROUTER, same)
    assert np.isnan(metrics.apgr) and metrics.cpt == {"20%": 0.0, "50%": 0.0, "80%": 0.0}
    curve = exact_curve(ROUTER, outcomes)
    assert np.isnan(share_to_reach(curve, 0.9))  # never reached
