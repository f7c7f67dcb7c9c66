"""Two scores' AUROC for one label on the same rows, and the standard error of their difference
(DeLong, DeLong and Clarke-Pearson 1988), which counts the two scores' correlation: how the
background retrain (sdk.traffic.retrain) and bench.confidence_auroc compare rankings. Numpy only."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def delong_components(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's structural components: for each positive, the share of negatives it
    outscores (ties half), and for each negative the share of positives outscoring it."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
    positives, negatives = scores[labels], scores[~labels]
    greater = (positives[:, None] > negatives[None, :]) + 0.5 * (positives[:, None] == negatives[None, :])
    return greater.mean(axis=1), greater.mean(axis=0)


def paired_auroc_difference_se(scores_a: np.ndarray, scores_b: np.ndarray, labels: np.ndarray) -> float:
    """Standard error of AUROC(a) - AUROC(b) on the same rows; NaN with fewer than two positives or negatives."""
    va, wa = delong_components(scores_a, labels)
    vb, wb = delong_components(scores_b, labels)
    if va.size < 2 or wa.size < 2:
        return float("nan")
    cov_v, cov_w = np.cov(np.stack([va, vb])), np.cov(np.stack([wa, wb]))
    variance = (cov_v[0, 0] + cov_v[1, 1] - 2 * cov_v[0, 1]) / va.size
    variance += (cov_w[0, 0] + cov_w[1, 1] - 2 * cov_w[0, 1]) / wa.size
    return math.sqrt(max(variance, 0.0))


@dataclass(frozen=True)
class PairedAuroc:
    """AUROC of two scores for one label on the same rows, and their difference's standard error."""

    auroc_a: float
    auroc_b: float
    difference_se: float  # of auroc_a - auroc_b; NaN when a class has fewer than two rows
    num_positive: int
    num_negative: int

    @property
    def difference(self) -> float:
        return self.auroc_a - self.auroc_b

    def a_beats_b(self, num_se: float = 1.0) -> bool:
        """a ranks better than b by more than `num_se` standard errors of the difference."""
        margin = num_se * self.difference_se
        return bool(math.isfinite(self.difference_se) and self.difference > max(margin, 0.0))


def paired_auroc(scores_a: np.ndarray, scores_b: np.ndarray, labels: np.ndarray) -> PairedAuroc:
    """Both AUROCs (ties count half; NaN without both classes) and the paired standard error."""
    labels = np.asarray(labels, bool)
    num_positive, num_negative = int(labels.sum()), int((~labels).sum())
    if not num_positive or not num_negative:
        return PairedAuroc(float("nan"), float("nan"), float("nan"), num_positive, num_negative)
    va, _ = delong_components(scores_a, labels)
    vb, _ = delong_components(scores_b, labels)
    se = paired_auroc_difference_se(scores_a, scores_b, labels)
    return PairedAuroc(float(va.mean()), float(vb.mean()), se, num_positive, num_negative)
