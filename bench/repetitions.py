"""Figures over repeated runs: the median, and the spread as (min, max), the shape every bench
that repeats its runs reports (a target inside the spread is not met)."""

from __future__ import annotations

import statistics


def median_and_spread(values: list[float]) -> tuple[float, list[float]]:
    """The median of `values` and [min, max]."""
    return float(statistics.median(values)), [float(min(values)), float(max(values))]
