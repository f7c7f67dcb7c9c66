"""Per-token signals read off TokenEvents: hand-computed values and bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confidence import SignalArrays, TokenSignals, signals_from_events, token_signals
from sdk.protocol.engine import TokenEvent, TopLogprob


def make_event(
    logprob: float, entropy: float = 0.5, margin: float = 0.3, alternatives: list[float] | None = None
) -> TokenEvent:
    """A token event with the given signals; `alternatives` are top-logprob probabilities."""
    top = [TopLogprob(token_id=i, text=f"t{i}", logprob=math.log(p)) for i, p in enumerate(alternatives or [])]
    return TokenEvent(
        request_id="r", token_id=7, text="x", logprob=logprob, entropy=entropy, margin=margin, top_logprobs=top
    )


def test_token_signals_hand_computed():
    signals = token_signals(make_event(math.log(0.5), entropy=0.69, margin=0.2, alternatives=[0.5, 0.3]))
    assert signals.logprob == pytest.approx(math.log(0.5))
    assert signals.prob == pytest.approx(0.5)
    assert signals.entropy == 0.69
    assert signals.margin == 0.2
    assert signals.topk_mass == pytest.approx(0.8)


def test_topk_mass_is_nan_without_alternatives():
    assert math.isnan(token_signals(make_event(-1.0)).topk_mass)


def test_logprob_rounded_above_zero_is_clamped():
    # Engines compute logit - log Z in finite precision; prob must not exceed 1.
    signals = token_signals(make_event(1e-7, alternatives=[1.0, 1e-3]))
    assert signals.logprob == 0.0 and signals.prob == 1.0
    assert signals.topk_mass == 1.0


def test_zero_probability_token():
    signals = token_signals(make_event(-math.inf))
    assert signals.prob == 0.0 and signals.logprob == -math.inf


def test_token_signals_is_frozen():
    signals = token_signals(make_event(-1.0))
    with pytest.raises(AttributeError):
        signals.prob = 1.0  # type: ignore[misc]


def test_signals_from_events_keeps_order_and_every_row():
    events = [
        make_event(math.log(p), entropy=e, margin=m) for p, e, m in [(0.9, 0.1, 0.8), (0.2, 1.5, 0.05), (0.6, 0.7, 0.3)]
    ]
    arrays = signals_from_events(events)
    assert len(arrays) == arrays.num_tokens == 3
    for column in (arrays.logprob, arrays.prob, arrays.entropy, arrays.margin, arrays.topk_mass):
        assert column.dtype == np.float64 and column.shape == (3,)
    np.testing.assert_allclose(arrays.prob, [0.9, 0.2, 0.6])
    np.testing.assert_allclose(arrays.entropy, [0.1, 1.5, 0.7])
    np.testing.assert_allclose(arrays.margin, [0.8, 0.05, 0.3])
    assert np.isnan(arrays.topk_mass).all()


def test_signals_from_no_events_are_empty_arrays():
    arrays = signals_from_events([])
    assert len(arrays) == 0
    assert arrays.prob.dtype == np.float64 and arrays.prob.shape == (0,)


def test_head_keeps_what_exists():
    arrays = signals_from_events([make_event(-0.1), make_event(-0.2)])
    assert len(arrays.head(1)) == 1 and arrays.head(1).logprob[0] == pytest.approx(-0.1)
    assert len(arrays.head(5)) == 2
    assert len(arrays.head(0)) == 0


def test_from_token_signals_matches_signals_from_events():
    events = [make_event(-0.3, alternatives=[0.7]), make_event(-2.0, alternatives=[0.4, 0.1])]
    direct = SignalArrays.from_token_signals([token_signals(e) for e in events])
    via_events = signals_from_events(events)
    np.testing.assert_array_equal(direct.topk_mass, via_events.topk_mass)
    np.testing.assert_allclose(direct.topk_mass, [0.7, 0.5])


probabilities = st.floats(min_value=1e-12, max_value=1.0)


@given(
    logprob=st.floats(min_value=-50.0, max_value=1e-6),
    alternatives=st.lists(probabilities, max_size=20),
)
def test_signal_bounds(logprob: float, alternatives: list[float]):
    signals = token_signals(make_event(logprob, alternatives=alternatives))
    assert isinstance(signals, TokenSignals)
    assert 0.0 <= signals.prob <= 1.0
    assert signals.logprob <= 0.0
    assert math.isclose(signals.prob, math.exp(signals.logprob))
    if alternatives:
        assert 0.0 < signals.topk_mass <= 1.0
    else:
        assert math.isnan(signals.topk_mass)
