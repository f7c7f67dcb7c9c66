"""Calibrators: map any raw confidence score (a signal, an aggregate, the probe's logit)
to P(local answer is acceptable), so that one routing threshold means the same thing
whichever score feeds it.

Platt scaling assumes the log-odds are linear in the score (two parameters, needs
little data); isotonic regression assumes only monotonicity (needs more data, can tie
scores). Both serialize to small JSON-safe dicts, stored e.g. inside a saved probe."""

from __future__ import annotations

import math

import numpy as np

from confidence.binary_inputs import as_scores, scores_and_labels

# Keeps the Platt slope finite when the scores separate the classes perfectly; small
# against the summed log-loss of any realistic calibration set (scores standardized).
PLATT_L2 = 1e-3
MAX_NEWTON_STEPS = 100


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """Logistic function without overflow warnings for large |z|."""
    exp_neg_abs = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + exp_neg_abs), exp_neg_abs / (1.0 + exp_neg_abs))


def _regularized_log_loss(design: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> float:
    logits = design @ weights
    return float(np.sum(np.logaddexp(0.0, logits) - targets * logits) + 0.5 * PLATT_L2 * weights @ weights)


def _fit_logistic_1d(x: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of L2-regularized logistic regression by damped Newton."""
    design = np.column_stack([x, np.ones_like(x)])
    base_rate = targets.mean()
    weights = np.array([0.0, math.log(base_rate / (1.0 - base_rate))])
    for _ in range(MAX_NEWTON_STEPS):
        probabilities = _sigmoid(design @ weights)
        gradient = design.T @ (probabilities - targets) + PLATT_L2 * weights
        curvature = probabilities * (1.0 - probabilities)
        hessian = (design * curvature[:, None]).T @ design + PLATT_L2 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        # Halve the step until the loss does not rise: plain Newton can overshoot when
        # the data are (nearly) separable and the curvature vanishes.
        current_loss = _regularized_log_loss(design, targets, weights)
        step_size = 1.0
        while step_size > 1e-8 and _regularized_log_loss(
            design, targets, weights - step_size * step
        ) > current_loss + 1e-12 * abs(current_loss):
            step_size /= 2.0
        weights = weights - step_size * step
        if np.max(np.abs(step_size * step)) < 1e-10:
            break
    return float(weights[0]), float(weights[1])


class PlattCalibrator:
    """P(acceptable) = sigmoid(a * score + b), a and b fitted by maximum likelihood."""

    kind = "platt"

    def __init__(self, a: float | None = None, b: float | None = None):
        self.a = a  # slope on the raw score; None until fitted
        self.b = b  # intercept

    def fit(self, scores, labels) -> PlattCalibrator:
        score_array, label_array = scores_and_labels(scores, labels, allow_infinite=False)
        # Fit on standardized scores so the L2 term and Newton's conditioning do not
        # depend on the score's scale (log-prob sums can be in the hundreds).
        center = float(score_array.mean())
        spread = float(score_array.std()) or 1.0
        slope, intercept = _fit_logistic_1d((score_array - center) / spread, label_array.astype(np.float64))
        self.a = slope / spread
        self.b = intercept - slope * center / spread
        return self

    def predict(self, scores) -> np.ndarray:
        if self.a is None or self.b is None:
            raise RuntimeError("PlattCalibrator is not fitted; call fit(scores, labels) first")
        score_array = as_scores(scores)
        with np.errstate(invalid="ignore"):
            logits = self.a * score_array + self.b
        # a == 0 with an infinite score gives NaN; the score then carries no information.
        return _sigmoid(np.where(np.isnan(logits), self.b, logits))

    def to_dict(self) -> dict:
        if self.a is None or self.b is None:
            raise RuntimeError("PlattCalibrator is not fitted; nothing to serialize")
        return {"kind": self.kind, "a": float(self.a), "b": float(self.b)}

    @classmethod
    def from_dict(cls, data: dict) -> PlattCalibrator:
        _check_kind(data, cls.kind)
        slope, intercept = data.get("a"), data.get("b")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (slope, intercept)):
            raise ValueError(f"platt calibrator needs finite numbers a and b, got {data!r}")
        return cls(float(slope), float(intercept))


def pool_adjacent_violators(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to `values` in weighted least squares."""
    block_means: list[float] = []
    block_weights: list[float] = []
    block_sizes: list[int] = []
    for value, weight in zip(values.tolist(), weights.tolist()):
        block_means.append(value)
        block_weights.append(weight)
        block_sizes.append(1)
        while len(block_means) > 1 and block_means[-2] > block_means[-1]:
            last_mean, last_weight, last_size = (
                block_means.pop(),
                block_weights.pop(),
                block_sizes.pop(),
            )
            merged_weight = block_weights[-1] + last_weight
            block_means[-1] = (block_means[-1] * block_weights[-1] + last_mean * last_weight) / merged_weight
            block_weights[-1] = merged_weight
            block_sizes[-1] += last_size
    return np.repeat(np.array(block_means), block_sizes)


def interpolate_monotone(scores: np.ndarray, x_points: np.ndarray, y_points: np.ndarray):
    """Piecewise-linear through the points, flat beyond them; unlike np.interp it stays
    monotone when points are only a few ulps apart (the slope overflows there), because
    each value is clamped to its own segment's ends."""
    if x_points.size == 1:
        return np.full(scores.shape, y_points[0])
    left = np.clip(np.searchsorted(x_points, scores, side="right") - 1, 0, x_points.size - 2)
    x_left, x_right = x_points[left], x_points[left + 1]
    y_left, y_right = y_points[left], y_points[left + 1]
    with np.errstate(over="ignore", invalid="ignore"):
        fraction = np.clip((scores - x_left) / (x_right - x_left), 0.0, 1.0)
    fraction = np.where(np.isnan(fraction), 0.0, fraction)  # both spans overflowed
    return np.clip(y_left + fraction * (y_right - y_left), y_left, y_right)


class IsotonicCalibrator:
    """Non-decreasing step fit of the labels (pool-adjacent-violators), predicted by
    linear interpolation between the fitted points and held flat beyond them."""

    kind = "isotonic"

    def __init__(self, x_points=None, y_points=None):
        self.x_points = None if x_points is None else np.asarray(x_points, dtype=np.float64)
        self.y_points = None if y_points is None else np.asarray(y_points, dtype=np.float64)

    def fit(self, scores, labels) -> IsotonicCalibrator:
        score_array, label_array = scores_and_labels(scores, labels, allow_infinite=False)
        # Equal scores must get one probability: pool them first, weighted by count.
        unique_scores, inverse, counts = np.unique(score_array, return_inverse=True, return_counts=True)
        label_means = np.bincount(inverse, weights=label_array.astype(np.float64)) / counts
        fitted = pool_adjacent_violators(label_means, counts.astype(np.float64))
        # Only the ends of each flat run matter for interpolation; drop the inner points.
        is_run_end = np.r_[True, fitted[1:] != fitted[:-1]] | np.r_[fitted[1:] != fitted[:-1], True]
        self.x_points, self.y_points = unique_scores[is_run_end], fitted[is_run_end]
        return self

    def predict(self, scores) -> np.ndarray:
        if self.x_points is None or self.y_points is None:
            raise RuntimeError("IsotonicCalibrator is not fitted; call fit(scores, labels) first")
        return interpolate_monotone(as_scores(scores), self.x_points, self.y_points)

    def to_dict(self) -> dict:
        if self.x_points is None or self.y_points is None:
            raise RuntimeError("IsotonicCalibrator is not fitted; nothing to serialize")
        return {"kind": self.kind, "x": self.x_points.tolist(), "y": self.y_points.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> IsotonicCalibrator:
        _check_kind(data, cls.kind)
        try:
            x_points = np.asarray(data["x"], dtype=np.float64)
            y_points = np.asarray(data["y"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"isotonic calibrator needs number lists x and y: {exc!r}") from exc
        if x_points.ndim != 1 or x_points.shape != y_points.shape or x_points.size == 0:
            raise ValueError("isotonic calibrator needs non-empty x and y of equal length")
        if not (np.isfinite(x_points).all() and np.all(np.diff(x_points) > 0)):
            raise ValueError("isotonic calibrator x must be finite and strictly increasing")
        if not (np.all((y_points >= 0) & (y_points <= 1)) and np.all(np.diff(y_points) >= 0)):
            raise ValueError("isotonic calibrator y must lie in [0, 1] and never decrease")
        return cls(x_points, y_points)


CALIBRATOR_CLASSES = {cls.kind: cls for cls in (PlattCalibrator, IsotonicCalibrator)}


def _check_kind(data, expected: str) -> None:
    if not isinstance(data, dict) or data.get("kind") != expected:
        raise ValueError(f"expected a dict with kind {expected!r}, got {data!r:.200}")


def calibrator_from_dict(data: dict) -> PlattCalibrator | IsotonicCalibrator:
    """The calibrator a `to_dict()` produced, whichever kind it is."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in CALIBRATOR_CLASSES:
        raise ValueError(f"unknown calibrator kind {kind!r}; known: {sorted(CALIBRATOR_CLASSES)}")
    return CALIBRATOR_CLASSES[kind].from_dict(data)
