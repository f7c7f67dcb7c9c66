"""Figures over repeated runs: the median, and the spread as (min, max), the shape every bench
that repeats its runs reports (a target inside the spread is not met); and the one quantile
the benches use over small samples."""

from __future__ import annotations

import math
import statistics


def median_and_spread(values: list[float]) -> tuple[float, list[float]]:
    """The median of `values` and [min, max]."""
    return float(statistics.median(values)), [float(min(values)), float(max(values))]


def nearest_rank(values: list[float], q: float) -> float:
    """The nearest-rank quantile: a value that was measured, never an interpolation (over ~30
    samples a p99 is their slowest, and says so)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
