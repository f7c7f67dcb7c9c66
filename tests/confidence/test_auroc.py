"""AUROC against a brute-force count over every (acceptable, unacceptable) pair."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confidence.auroc import auroc, average_ranks


def pairwise_auroc(scores, labels) -> float:
    positives = [s for s, label in zip(scores, labels) if label]
    negatives = [s for s, label in zip(scores, labels) if not label]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(-3, 3), st.floats(-1e6, 1e6), st.just(float("inf"))),
            st.booleans(),
        ),
        min_size=2,
        max_size=30,
    )
)
def test_auroc_matches_the_pairwise_count_ties_included(rows):
    labels = [label for _, label in rows]
    if all(labels) or not any(labels):
        labels[0] = not labels[0]
    scores = [float(score) for score, _ in rows]
    assert auroc(scores, labels) == pytest.approx(pairwise_auroc(scores, labels), abs=1e-12)


def test_known_values():
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([1, 2, 3], [0, 1, 1]) == 1.0
    assert auroc([1, 2, 3], [1, 0, 0]) == 0.0
    assert auroc([5, 5, 5, 5], [0, 1, 0, 1]) == 0.5


def test_ties_share_their_mean_rank():
    np.testing.assert_array_equal(average_ranks(np.array([3.0, 1.0, 3.0, np.inf, np.inf])), [2.5, 1.0, 2.5, 4.5, 4.5])


@pytest.mark.parametrize(
    "scores, labels, message",
    [
        ([0.1, np.nan], [0, 1], "NaN"),
        ([], [], "empty"),
        ([0.1, 0.2], [1, 1], "both classes"),
        ([0.1], [0, 1], "length"),
    ],
)
def test_undefined_auroc_is_an_error(scores, labels, message):
    with pytest.raises(ValueError, match=message):
        auroc(scores, labels)
