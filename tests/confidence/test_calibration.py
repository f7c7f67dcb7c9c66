"""Platt and isotonic calibrators: known parameters recovered, PAV against a brute-force
isotonic fit, JSON round trips, and clear errors for unusable input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from confidence.calibration import (
    IsotonicCalibrator,
    PlattCalibrator,
    calibrator_from_dict,
    pool_adjacent_violators,
)


def logistic_labels(scores: np.ndarray, a: float, b: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.random(scores.size) < 1.0 / (1.0 + np.exp(-(a * scores + b)))


def brute_force_isotonic(values: list[float], weights: list[float]) -> np.ndarray:
    """The min-max formula: fit_i = max over j <= i of min over k >= i of mean(j..k)."""
    n = len(values)

    def block_mean(j: int, k: int) -> float:
        return sum(v * w for v, w in zip(values[j : k + 1], weights[j : k + 1])) / sum(weights[j : k + 1])

    return np.array([max(min(block_mean(j, k) for k in range(i, n)) for j in range(i + 1)) for i in range(n)])


def test_platt_recovers_the_generating_parameters():
    scores = np.random.default_rng(1).normal(0.0, 2.0, size=40_000)
    calibrator = PlattCalibrator().fit(scores, logistic_labels(scores, a=1.7, b=-0.4))
    assert calibrator.a == pytest.approx(1.7, abs=0.06)
    assert calibrator.b == pytest.approx(-0.4, abs=0.05)


def test_platt_does_not_depend_on_the_score_scale():
    scores = np.random.default_rng(2).normal(size=2_000)
    labels = logistic_labels(scores, a=2.0, b=0.5)
    unit = PlattCalibrator().fit(scores, labels)
    shifted = PlattCalibrator().fit(scores * 300.0 - 500.0, labels)  # like a log-prob sum
    np.testing.assert_allclose(unit.predict(scores), shifted.predict(scores * 300.0 - 500.0), atol=1e-6)


def test_platt_stays_finite_on_separable_data():
    scores = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
    calibrator = PlattCalibrator().fit(scores, [0, 0, 0, 1, 1, 1])
    assert np.isfinite([calibrator.a, calibrator.b]).all() and calibrator.a > 0
    predictions = calibrator.predict([-3.0, 0.0, 3.0, np.inf, -np.inf])
    assert predictions[0] < 0.01 and predictions[2] > 0.99
    assert predictions[1] == pytest.approx(0.5, abs=0.01)
    assert predictions[3] == 1.0 and predictions[4] == 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-50, 50), st.floats(0.1, 5.0)), min_size=1, max_size=9),
)
def test_pool_adjacent_violators_matches_the_brute_force_fit(points):
    values, weights = [v for v, _ in points], [w for _, w in points]
    fitted = pool_adjacent_violators(np.array(values), np.array(weights))
    np.testing.assert_allclose(fitted, brute_force_isotonic(values, weights), rtol=1e-9, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.booleans()), min_size=2, max_size=14))
def test_isotonic_fits_the_brute_force_solution_at_every_score(rows):
    labels = [label for _, label in rows]
    if all(labels) or not any(labels):
        labels[0] = not labels[0]
    scores = np.array([score for score, _ in rows], dtype=np.float64)
    calibrator = IsotonicCalibrator().fit(scores, labels)
    unique_scores = np.unique(scores)
    # Equal scores pool into one point weighted by their count (tied scores, one answer).
    label_means = [float(np.mean(np.array(labels)[scores == s])) for s in unique_scores]
    counts = [float(np.sum(scores == s)) for s in unique_scores]
    np.testing.assert_allclose(calibrator.predict(unique_scores), brute_force_isotonic(label_means, counts), atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e3, 1e3), st.booleans()), min_size=2, max_size=40))
@example(rows=[(1.0, False), (5e-324, True), (-5e-324, False)])  # np.interp broke here
def test_isotonic_predictions_are_monotone_and_in_the_unit_interval(rows):
    labels = [label for _, label in rows]
    if all(labels) or not any(labels):
        labels[0] = not labels[0]
    calibrator = IsotonicCalibrator().fit([score for score, _ in rows], labels)
    grid = np.concatenate([[-np.inf, -2e3], np.linspace(-1.1e3, 1.1e3, 501), [2e3, np.inf]])
    predictions = calibrator.predict(grid)
    assert np.all(np.diff(predictions) >= 0)
    assert np.all((predictions >= 0) & (predictions <= 1))


def test_isotonic_interpolates_between_fitted_points():
    calibrator = IsotonicCalibrator().fit([0.0, 1.0, 2.0, 3.0], [0, 0, 1, 1])
    np.testing.assert_allclose(calibrator.predict([-1.0, 0.5, 1.5, 1.75, 9.0]), [0.0, 0.0, 0.5, 0.75, 1.0])
    assert calibrator.x_points.tolist() == [0.0, 1.0, 2.0, 3.0]  # only run ends are kept


@pytest.mark.parametrize("calibrator_class", [PlattCalibrator, IsotonicCalibrator])
def test_json_round_trip_predicts_the_same(calibrator_class):
    scores = np.random.default_rng(3).normal(size=300)
    calibrator = calibrator_class().fit(scores, logistic_labels(scores, a=1.0, b=0.0))
    restored = calibrator_from_dict(json.loads(json.dumps(calibrator.to_dict(), allow_nan=False)))
    assert type(restored) is calibrator_class
    np.testing.assert_array_equal(restored.predict(scores), calibrator.predict(scores))


@pytest.mark.parametrize(
    "scores, labels, message",
    [
        ([], [], "empty"),
        ([0.1, 0.2, 0.3], [1, 1, 1], "both classes"),
        ([0.1, np.nan, 0.3], [0, 1, 1], "NaN"),
        ([0.1, np.inf, 0.3], [0, 1, 1], "infinite"),
        ([0.1, 0.2, 0.3], [0, 1, np.nan], "NaN"),
        ([0.1, 0.2, 0.3], [0, 1, 2], "0/1"),
        ([0.1, 0.2], [0, 1, 1], "length"),
        ([[0.1, 0.2]], [[0, 1]], "1-D"),
    ],
)
@pytest.mark.parametrize("calibrator_class", [PlattCalibrator, IsotonicCalibrator])
def test_unusable_input_is_refused_with_the_reason(calibrator_class, scores, labels, message):
    with pytest.raises(ValueError, match=message):
        calibrator_class().fit(scores, labels)


@pytest.mark.parametrize("calibrator_class", [PlattCalibrator, IsotonicCalibrator])
def test_unfitted_calibrator_says_so(calibrator_class):
    with pytest.raises(RuntimeError, match="not fitted"):
        calibrator_class().predict([0.5])
    calibrator = calibrator_class().fit([0.0, 1.0], [0, 1])
    with pytest.raises(ValueError, match="NaN"):
        calibrator.predict([np.nan])


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "beta", "a": 1.0},
        {"kind": "platt", "a": 1.0},
        {"kind": "platt", "a": float("nan"), "b": 0.0},
        {"kind": "isotonic", "x": [0.0, 1.0], "y": [0.5]},
        {"kind": "isotonic", "x": [1.0, 0.0], "y": [0.2, 0.5]},
        {"kind": "isotonic", "x": [0.0, 1.0], "y": [0.5, 0.2]},
        {"kind": "isotonic", "x": [0.0, 1.0], "y": [0.5, 1.2]},
        "platt",
    ],
)
def test_malformed_dicts_are_refused(data):
    with pytest.raises(ValueError):
        calibrator_from_dict(data)
