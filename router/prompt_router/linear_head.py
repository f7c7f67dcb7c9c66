"""The router's cold-start head: two ridge regressions on standardized prompt-shape
features, one for "the weak (local) tier answers right", one for "the strong (cloud) tier
answers right".

Why two and not one classifier: routing pays off by the strong tier's gain over the weak
one, p_strong - p_weak, and a "weak is wrong" label alone ranks prompts neither tier can
answer first (RouteLLM's high-school mathematics table: the weak tier right 32%, the strong
one 3%). Ridge is linear in its target, so p_strong - p_weak is exactly the ridge fit of
the gain.

The fit is kept as sufficient statistics (weighted sums of x, x x^T, y, x y per tier), which
add: a router file carries the statistics of the tables it was trained on, so a retrain on
an app's traffic (`tandem router train --from-traffic`, the background retrain) refits
exactly as if the public tables were there, without them. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_ALPHA = 1.0  # ridge penalty on standardized features (grouped CV: 1 to 100 alike, 1000 worse)
TIERS = ("weak", "strong")


@dataclass(frozen=True)
class LinearHead:
    """p = ((shape - mean) / std) @ weights + bias, columns (weak, strong)."""

    mean: np.ndarray  # [k] training mean of each shape feature
    std: np.ndarray  # [k] its standard deviation (floored)
    weights: np.ndarray  # [k, 2]
    bias: np.ndarray  # [2]

    def predict(self, shape: np.ndarray) -> np.ndarray:
        """[n, 2]: predicted chance each tier answers right (a linear fit: may leave [0, 1])."""
        return ((np.asarray(shape, np.float64) - self.mean) / self.std) @ self.weights + self.bias

    def folded(self) -> tuple[np.ndarray, np.ndarray]:
        """(weight [k, 2], bias [2]) acting on raw features: the standardization folded in."""
        weight = self.weights / self.std[:, None]
        return weight, self.bias - (self.mean / self.std) @ self.weights


@dataclass(frozen=True)
class HeadStatistics:
    """Everything a ridge fit needs, summed over rows: unweighted moments of the features (for
    the standardization) and, per tier, weighted moments over the rows that know its label."""

    num_rows: float
    feature_sum: np.ndarray  # [k]
    feature_square_sum: np.ndarray  # [k]
    weight_sum: np.ndarray  # [2]
    x_sum: np.ndarray  # [2, k]
    xx_sum: np.ndarray  # [2, k, k]
    y_sum: np.ndarray  # [2]
    xy_sum: np.ndarray  # [2, k]

    @classmethod
    def empty(cls, k: int) -> HeadStatistics:
        return cls(
            0.0,
            np.zeros(k),
            np.zeros(k),
            np.zeros(2),
            np.zeros((2, k)),
            np.zeros((2, k, k)),
            np.zeros(2),
            np.zeros((2, k)),
        )

    @classmethod
    def of(cls, shape: np.ndarray, labels: np.ndarray, weight: np.ndarray | None = None) -> HeadStatistics:
        """`labels` [n, 2]: how right each tier was in [0, 1], NaN where unknown."""
        x = np.asarray(shape, np.float64)
        labels = np.asarray(labels, np.float64).reshape(len(x), 2)
        if x.ndim != 2:
            raise ValueError("shape must be a [rows, features] matrix")
        weight = np.ones(len(x)) if weight is None else np.asarray(weight, np.float64)
        parts = {name: [] for name in ("weight_sum", "x_sum", "xx_sum", "y_sum", "xy_sum")}
        for column in range(2):
            known = ~np.isnan(labels[:, column])
            w, xk, y = weight[known], x[known], labels[known, column]
            parts["weight_sum"].append(w.sum())
            parts["x_sum"].append(w @ xk)
            parts["xx_sum"].append(xk.T @ (xk * w[:, None]))
            parts["y_sum"].append(w @ y)
            parts["xy_sum"].append(xk.T @ (w * y))
        return cls(float(len(x)), x.sum(0), (x**2).sum(0), **{name: np.array(values) for name, values in parts.items()})

    def __add__(self, other: HeadStatistics) -> HeadStatistics:
        return HeadStatistics(*(a + b for a, b in zip(self._fields(), other._fields())))

    def _fields(self) -> tuple:
        return (
            self.num_rows,
            self.feature_sum,
            self.feature_square_sum,
            self.weight_sum,
            self.x_sum,
            self.xx_sum,
            self.y_sum,
            self.xy_sum,
        )

    def solve(self, alpha: float = DEFAULT_ALPHA, features=None) -> LinearHead:
        """The ridge fit on standardized features (intercept unpenalized), per tier; with
        `features` (column indices) only those columns get weights, the rest weigh zero (a
        recipe's feature subset: the statistics keep every column, so a retrain can use them)."""
        for column, tier in enumerate(TIERS):
            if self.weight_sum[column] <= 0:
                raise ValueError(f"no row knows how the {tier} tier did; a head needs labels of both tiers")
        mean = self.feature_sum / self.num_rows
        std = np.maximum(np.sqrt(np.maximum(self.feature_square_sum / self.num_rows - mean**2, 0.0)), 1e-6)
        k = len(mean)
        used = np.arange(k) if features is None else np.asarray(sorted(set(features)), np.int64)
        weights, bias = np.zeros((k, 2)), np.zeros(2)
        for column in range(2):
            total = self.weight_sum[column]
            x_mean = self.x_sum[column] / total
            y_mean = self.y_sum[column] / total
            scatter = self.xx_sum[column] - total * np.outer(x_mean, x_mean)  # weighted, centred
            cross = self.xy_sum[column] - total * x_mean * y_mean
            s = std[used]
            coef = np.linalg.solve(
                scatter[np.ix_(used, used)] / np.outer(s, s) + alpha * np.eye(used.size), cross[used] / s
            )
            weights[used, column] = coef
            coef = weights[:, column]
            bias[column] = y_mean - ((x_mean - mean) / std) @ coef
        return LinearHead(mean, std, weights, bias)

    def as_json(self) -> dict:
        names = ("num_rows", "feature_sum", "feature_square_sum", "weight_sum", "x_sum", "xx_sum", "y_sum", "xy_sum")
        return {name: np.asarray(value).tolist() for name, value in zip(names, self._fields())}

    @classmethod
    def from_json(cls, document: dict) -> HeadStatistics:
        try:
            return cls(
                float(document["num_rows"]),
                *(
                    np.array(document[name], np.float64)
                    for name in (
                        "feature_sum",
                        "feature_square_sum",
                        "weight_sum",
                        "x_sum",
                        "xx_sum",
                        "y_sum",
                        "xy_sum",
                    )
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"head statistics are malformed: {exc}") from exc


def fit_head(
    shape: np.ndarray,
    weak: np.ndarray,
    strong: np.ndarray,
    alpha: float = DEFAULT_ALPHA,
    sample_weight: np.ndarray | None = None,
    features=None,
) -> LinearHead:
    """`weak` / `strong`: per row, how right that tier was in [0, 1], NaN where unknown. Each
    column is fitted on the rows that know it; `sample_weight` counts rows more or less."""
    weak, strong = np.asarray(weak, np.float64), np.asarray(strong, np.float64)
    if len(shape) != len(weak) or len(weak) != len(strong):
        raise ValueError("shape rows, weak labels and strong labels must have one length")
    return HeadStatistics.of(shape, np.c_[weak, strong], sample_weight).solve(alpha, features)
