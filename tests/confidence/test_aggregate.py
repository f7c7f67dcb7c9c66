"""Sequence aggregators and RunningConfidence: hand examples, edge cases, properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confidence import (
    FEATURE_NAMES,
    QUANTILE_LEVELS,
    RunningConfidence,
    features_dict,
    quantile_of_sorted,
    sequence_features,
    signals_from_events,
)
from sdk.protocol.engine import TokenEvent, TopLogprob


def make_events(probs, entropies=None, margins=None, alternatives=None) -> list[TokenEvent]:
    """One TokenEvent per probability; `alternatives` is a per-token list of top-logprob probabilities."""
    n = len(probs)
    entropies = entropies if entropies is not None else [0.5] * n
    margins = margins if margins is not None else [0.3] * n
    alternatives = alternatives if alternatives is not None else [[]] * n
    return [
        TokenEvent(
            request_id="r",
            token_id=i,
            text="x",
            logprob=math.log(p) if p > 0 else -math.inf,
            entropy=e,
            margin=m,
            top_logprobs=[TopLogprob(token_id=j, text="a", logprob=math.log(a)) for j, a in enumerate(alts)],
        )
        for i, (p, e, m, alts) in enumerate(zip(probs, entropies, margins, alternatives))
    ]


HAND_PROBS = [0.9, 0.2, 0.4, 0.9]
HAND_EVENTS = make_events(HAND_PROBS, entropies=[0.1, 1.5, 0.8, 0.2], margins=[0.85, 0.05, 0.1, 0.8])


def test_feature_names_are_stable_and_unique():
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    assert FEATURE_NAMES[0] == "num_tokens"
    for q in QUANTILE_LEVELS:
        assert f"quantile_{q:g}" in FEATURE_NAMES


def test_hand_computed_features():
    features = features_dict(signals_from_events(HAND_EVENTS), window=2)
    expected = {
        "num_tokens": 4.0,
        "mean_logprob": (2 * math.log(0.9) + math.log(0.2) + math.log(0.4)) / 4,
        "mean_prob": 0.6,
        "min_prob": 0.2,
        # sorted probs [0.2, 0.4, 0.9, 0.9]; position q * 3 between order statistics
        "quantile_0.05": 0.2 + 0.15 * 0.2,
        "quantile_0.1": 0.2 + 0.3 * 0.2,
        "quantile_0.25": 0.2 + 0.75 * 0.2,
        "mean_entropy": 0.65,
        "max_entropy": 1.5,
        "mean_margin": 0.45,
        "min_margin": 0.05,
        "window_min_mean_prob": 0.3,  # windows of 2: means 0.55, 0.3, 0.65
        "window_mean_prob": 0.65,
    }
    for name, value in expected.items():
        assert features[name] == pytest.approx(value), name
    assert math.isnan(features["mean_topk_mass"])


def test_vector_matches_dict_order():
    signals = signals_from_events(HAND_EVENTS)
    vector = sequence_features(signals, window=3)
    assert vector.dtype == np.float64 and vector.shape == (len(FEATURE_NAMES),)
    as_dict = features_dict(signals, window=3)
    np.testing.assert_array_equal(vector, [as_dict[name] for name in FEATURE_NAMES])


def test_quantiles_match_numpy_linear_method():
    signals = signals_from_events(HAND_EVENTS)
    features = features_dict(signals)
    for q in QUANTILE_LEVELS:
        assert features[f"quantile_{q:g}"] == pytest.approx(np.quantile(signals.prob, q))


def test_first_k_uses_only_the_first_tokens():
    signals = signals_from_events(HAND_EVENTS)
    features = features_dict(signals, first_k=2, window=2)
    assert features["num_tokens"] == 2.0
    assert features["mean_prob"] == pytest.approx(0.55)
    assert features["min_prob"] == pytest.approx(0.2)
    assert features["max_entropy"] == pytest.approx(1.5)
    assert features["window_min_mean_prob"] == features["window_mean_prob"] == pytest.approx(0.55)
    np.testing.assert_array_equal(sequence_features(signals, first_k=99), sequence_features(signals))


@pytest.mark.parametrize("first_k", [None, 0, 3])
def test_empty_sequence_gives_nan_features(first_k):
    vector = sequence_features(signals_from_events([]), first_k=first_k)
    assert vector[0] == 0.0
    assert np.isnan(vector[1:]).all()


def test_first_k_zero_is_empty():
    vector = sequence_features(signals_from_events(HAND_EVENTS), first_k=0)
    assert vector[0] == 0.0 and np.isnan(vector[1:]).all()


def test_sequence_shorter_than_window_is_one_window():
    features = features_dict(signals_from_events(make_events([0.5, 0.7])), window=8)
    assert features["window_min_mean_prob"] == features["window_mean_prob"] == pytest.approx(0.6)


def test_topk_mass_averages_tokens_that_carry_alternatives():
    events = make_events([0.5, 0.5, 0.5], alternatives=[[0.5, 0.3], [], [0.6]])
    assert features_dict(signals_from_events(events))["mean_topk_mass"] == pytest.approx(0.7)


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"window": -1}, {"window": 2.5}, {"first_k": -1}, {"first_k": 1.5}])
def test_bad_parameters_raise(kwargs):
    with pytest.raises(ValueError):
        sequence_features(signals_from_events(HAND_EVENTS), **kwargs)


def test_quantile_of_sorted_edges():
    assert math.isnan(quantile_of_sorted([], 0.1))
    assert quantile_of_sorted([0.3], 0.25) == 0.3
    assert quantile_of_sorted([0.1, 0.5], 0.0) == 0.1


def test_running_hand_example_and_score_kinds():
    running = RunningConfidence(window=2)
    assert running.num_tokens == 0
    assert math.isnan(running.score("mean_prob")) and running.score("num_tokens") == 0.0
    for event in HAND_EVENTS:
        running.update(event)
    assert running.num_tokens == 4
    assert running.score() == pytest.approx(0.6)
    assert running.score("min_prob") == pytest.approx(0.2)
    assert running.score("quantile_0.1") == pytest.approx(0.26)
    assert running.score("window_mean_prob") == pytest.approx(0.65)
    assert running.score("window_min_mean_prob") == pytest.approx(0.3)
    with pytest.raises(ValueError, match="unknown confidence score"):
        running.score("median")
    with pytest.raises(ValueError):
        RunningConfidence(window=0)


# Hypothesis: sequences of realistic token events (logprob may underflow to -inf).
token_probs = st.one_of(st.floats(min_value=1e-9, max_value=1.0), st.just(0.0))
token_rows = st.tuples(
    token_probs,
    st.floats(min_value=0.0, max_value=12.0),  # entropy (nats)
    st.floats(min_value=0.0, max_value=1.0),  # margin
    st.lists(st.floats(min_value=1e-6, max_value=0.2), max_size=5),  # alternatives
)
event_sequences = st.lists(token_rows, max_size=40).map(
    lambda rows: make_events(*map(list, zip(*rows))) if rows else []
)
windows = st.integers(min_value=1, max_value=12)


@settings(max_examples=150, deadline=None)
@given(events=event_sequences, window=windows)
def test_running_equals_batch_on_every_prefix(events, window):
    signals = signals_from_events(events)
    running = RunningConfidence(window=window)
    for n in range(len(events) + 1):
        if n:
            running.update(events[n - 1])
        batch = sequence_features(signals, first_k=n, window=window)
        np.testing.assert_allclose(running.features(), batch, rtol=1e-9, atol=1e-12, equal_nan=True)
        np.testing.assert_allclose(batch, sequence_features(signals.head(n), window=window), equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(events=event_sequences.filter(bool), window=windows)
def test_probability_aggregates_are_ordered(events, window):
    f = features_dict(signals_from_events(events), window=window)
    max_prob = max(math.exp(e.logprob) for e in events)
    tolerance = 1e-12  # means are sums divided by a count
    # Quantiles are ordered order statistics; a low quantile can exceed the mean
    # (e.g. [0, 1, 1, 1, 1, 1, 1, 1]), so it is bounded by min and max only.
    assert f["min_prob"] <= f["quantile_0.05"] <= f["quantile_0.1"] <= f["quantile_0.25"] <= max_prob
    assert f["min_prob"] - tolerance <= f["window_min_mean_prob"] <= f["window_mean_prob"] <= max_prob + tolerance
    assert f["min_prob"] - tolerance <= f["mean_prob"] <= max_prob + tolerance
    assert f["min_margin"] <= f["mean_margin"] + tolerance and f["mean_entropy"] <= f["max_entropy"] + tolerance


@settings(max_examples=100, deadline=None)
@given(events=event_sequences.filter(bool), data=st.data())
def test_window_extremes(events, data):
    signals = signals_from_events(events)
    wide = features_dict(signals, window=data.draw(st.integers(min_value=len(events), max_value=len(events) + 5)))
    assert wide["window_min_mean_prob"] == wide["window_mean_prob"] == pytest.approx(wide["mean_prob"], abs=1e-12)
    single = features_dict(signals, window=1)
    assert single["window_min_mean_prob"] == single["min_prob"]
    assert single["window_mean_prob"] == signals.prob[-1]


ORDER_FREE = [name for name in FEATURE_NAMES if not name.startswith("window_")]


@settings(max_examples=100, deadline=None)
@given(events=event_sequences, data=st.data())
def test_order_free_features_ignore_token_order(events, data):
    shuffled = data.draw(st.permutations(events))
    before = features_dict(signals_from_events(events))
    after = features_dict(signals_from_events(shuffled))
    np.testing.assert_allclose(
        [after[n] for n in ORDER_FREE], [before[n] for n in ORDER_FREE], rtol=1e-9, atol=1e-12, equal_nan=True
    )
