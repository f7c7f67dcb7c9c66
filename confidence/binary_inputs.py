"""Checks shared by AUROC and the calibrators: 1-D scores and 0/1 labels of "the local
answer was acceptable", turned into float64/bool arrays or rejected with a message that
says what to fix."""

from __future__ import annotations

import numpy as np


def as_scores(scores, *, what: str = "scores", allow_infinite: bool = True) -> np.ndarray:
    """`scores` as a 1-D float64 array; NaN (and, unless allowed, ±inf) is an error."""
    try:
        array = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be numbers: {exc}") from exc
    if array.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {array.shape}")
    bad = np.isnan(array) if allow_infinite else ~np.isfinite(array)
    if bad.any():
        kind = "NaN" if allow_infinite else "NaN or infinite values"
        raise ValueError(
            f"{what} contain {kind} ({int(bad.sum())} of {array.size}, first at index "
            f"{int(np.flatnonzero(bad)[0])}); drop those rows or impute them first"
        )
    return array


def as_binary_labels(labels, *, what: str = "labels") -> np.ndarray:
    """`labels` (bool, or numbers that are all 0 or 1) as a 1-D bool array."""
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {array.shape}")
    if array.dtype == bool:
        return array
    try:
        numeric = array.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be bool or 0/1: {exc}") from exc
    if np.isnan(numeric).any():
        raise ValueError(f"{what} contain NaN; every row needs a 0/1 label")
    if not np.isin(numeric, (0.0, 1.0)).all():
        odd = numeric[~np.isin(numeric, (0.0, 1.0))][0]
        raise ValueError(f"{what} must be 0/1 (1 = local answer acceptable), found {odd!r}")
    return numeric == 1.0


def scores_and_labels(
    scores, labels, *, allow_infinite: bool = True, need_both_classes: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Validated, equally long, non-empty (scores, labels) with both classes present."""
    score_array = as_scores(scores, allow_infinite=allow_infinite)
    label_array = as_binary_labels(labels)
    if score_array.size != label_array.size:
        raise ValueError(f"scores and labels differ in length ({score_array.size} vs {label_array.size})")
    if score_array.size == 0:
        raise ValueError("scores and labels are empty; need at least one of each class")
    if need_both_classes:
        num_positive = int(label_array.sum())
        if num_positive in (0, label_array.size):
            only = "acceptable (1)" if num_positive else "unacceptable (0)"
            raise ValueError(f"all {label_array.size} labels are {only}; need examples of both classes")
    return score_array, label_array
