"""AUROC of a confidence score for "the local answer is acceptable": the probability that
a random acceptable answer scores higher than a random unacceptable one (ties count
half). The common yardstick for signals, aggregates and the learned probe."""

from __future__ import annotations

import numpy as np

from confidence.binary_inputs import scores_and_labels


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    # `!=` rather than np.diff: inf - inf is NaN and would split a tie of two infinities.
    group_starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    group_ends = np.r_[group_starts[1:], values.size]
    mean_rank = (group_starts + 1 + group_ends) / 2.0
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, group_ends - group_starts)
    return ranks


def auroc(scores, labels) -> float:
    """Area under the ROC curve of `scores` (higher = more confident) against 0/1 `labels`.

    Rank-based (Mann-Whitney U), O(n log n). Raises ValueError on NaN scores, empty input,
    mismatched lengths or a single class, where AUROC is undefined."""
    score_array, label_array = scores_and_labels(scores, labels)
    ranks = average_ranks(score_array)
    num_positive = int(label_array.sum())
    num_negative = label_array.size - num_positive
    positive_rank_sum = float(ranks[label_array].sum())
    wins = positive_rank_sum - num_positive * (num_positive + 1) / 2.0
    return wins / (num_positive * num_negative)
