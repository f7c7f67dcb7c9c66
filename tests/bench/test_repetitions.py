"""The benches' one quantile over small samples: a measured value, never an interpolation."""

from __future__ import annotations

import pytest

from bench.repetitions import median_and_spread, nearest_rank


def test_nearest_rank_picks_measured_values():
    thirty = [float(v) for v in range(30, 0, -1)]
    assert nearest_rank(thirty, 0.99) == 30.0  # over 30 samples p99 is the slowest
    assert nearest_rank([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert nearest_rank([7.0], 0.01) == 7.0
    with pytest.raises(ValueError):
        nearest_rank([], 0.5)


def test_median_and_spread():
    assert median_and_spread([3.0, 1.0, 2.0]) == (2.0, [1.0, 3.0])
