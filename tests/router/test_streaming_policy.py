"""StreamingPolicy against an independent reference: confidence recomputed from scratch
with confidence.sequence_features at every candidate decision point."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from confidence import (
    FEATURE_NAMES,
    PlattCalibrator,
    sequence_features,
    signals_from_events,
)
from router.decision import Reason, Tier
from router.streaming_policy import DecideAt, StreamingPolicy
from sdk.protocol.engine import TokenEvent
from sdk.engine_common.repetition import ESCALATE_LOOP, find_loop

WINDOW = 4  # small, so the window features differ from the whole-answer ones
SCORE_KINDS = ["mean_prob", "min_prob", "quantile_0.1", "window_mean_prob", "window_min_mean_prob", "mean_margin"]


def make_event(logprob: float, margin: float = 0.1, token_id: int = 7) -> TokenEvent:
    return TokenEvent(request_id="r", token_id=token_id, text="x", logprob=logprob, entropy=0.5, margin=margin)


# Token ids drawn wide, so answers do not repeat themselves: the loop rule has its own tests.
token_events = st.builds(
    make_event,
    st.floats(min_value=-8.0, max_value=0.0),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=0, max_value=2**30),
)
answers = st.lists(token_events, max_size=30)
thresholds = st.floats(min_value=0.0, max_value=1.0)


def reference_confidence(events, num_tokens, kind, calibrator=None) -> float:
    features = sequence_features(signals_from_events(events[:num_tokens]), window=WINDOW)
    value = float(features[FEATURE_NAMES.index(kind)])
    if calibrator is not None and not math.isnan(value):
        value = float(calibrator.predict(np.array([value]))[0])
    return value


def reference_outcome(events, threshold, k, decide_at, kind, calibrator=None):
    """(escalated, decision point, confidence there), written out from the spec."""
    num_tokens = len(events)
    if decide_at == "end" or num_tokens < k:
        points = [num_tokens]
    elif decide_at == "first_k":
        points = [k]
    else:
        points = list(range(k, num_tokens + 1))
    for point in points:
        confidence = reference_confidence(events, point, kind, calibrator)
        if 0.0 < threshold < 1.0 and not math.isnan(confidence):
            # Running sums and numpy's pairwise sums may differ in the last bits.
            assume(abs(confidence - threshold) > 1e-9)
        below = math.isnan(confidence) or confidence < threshold
        if threshold >= 1.0 or (threshold > 0.0 and below):
            return True, point, confidence
    return False, points[-1], confidence


def run_policy(policy, events):
    """Feed events until an escalation; returns (final decision, tokens fed)."""
    for num_fed, event in enumerate(events, start=1):
        escalation = policy.observe(event)
        if escalation is not None:
            assert policy.finish() is escalation
            return escalation, num_fed
    return policy.finish(), len(events)


def assert_same_confidence(actual, expected):
    assert (math.isnan(actual) and math.isnan(expected)) or math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(answers, thresholds, st.integers(1, 12), st.sampled_from(list(DecideAt)), st.sampled_from(SCORE_KINDS))
def test_escalates_exactly_when_confidence_at_the_decision_point_is_below_threshold(
    events, threshold, k, decide_at, kind
):
    expected_escalated, expected_point, expected_confidence = reference_outcome(
        events, threshold, k, decide_at.value, kind
    )
    policy = StreamingPolicy(threshold, k, score_kind=kind, decide_at=decide_at, window=WINDOW)
    decision, num_fed = run_policy(policy, events)
    assert decision.escalated is expected_escalated
    assert decision.tier is (Tier.CLOUD if expected_escalated else Tier.LOCAL)
    assert decision.reason == (Reason.LOW_CONFIDENCE if expected_escalated else Reason.CONFIDENT)
    assert decision.decided_at_token == expected_point
    assert_same_confidence(decision.confidence, expected_confidence)
    if expected_escalated and decision.decided_at_token < len(events):
        assert num_fed == expected_point  # escalated during the stream, at that very token


@settings(max_examples=200, deadline=None)
@given(answers, st.integers(1, 12), st.sampled_from(list(DecideAt)), st.sampled_from(SCORE_KINDS))
def test_threshold_zero_never_and_one_always_escalates(events, k, decide_at, kind):
    never = StreamingPolicy(0.0, k, score_kind=kind, decide_at=decide_at, window=WINDOW)
    assert not run_policy(never, events)[0].escalated
    always = StreamingPolicy(1.0, k, score_kind=kind, decide_at=decide_at, window=WINDOW)
    assert run_policy(always, events)[0].escalated


@settings(max_examples=200, deadline=None)
@given(answers, thresholds, st.integers(1, 12), st.sampled_from(list(DecideAt)))
def test_no_decision_before_k_tokens(events, threshold, k, decide_at):
    policy = StreamingPolicy(threshold, k, decide_at=decide_at)
    for event in events[: k - 1]:
        assert policy.observe(event) is None
        assert policy.decision is None


@settings(max_examples=100, deadline=None)
@given(answers, thresholds, st.integers(1, 12))
def test_calibrated_confidence_is_what_the_threshold_sees(events, threshold, k):
    calibrator = PlattCalibrator(a=1.5, b=2.0)  # mean_logprob in [-8, 0] -> P(acceptable)
    expected_escalated, expected_point, expected_confidence = reference_outcome(
        events, threshold, k, "every_token", "mean_logprob", calibrator
    )
    policy = StreamingPolicy(threshold, k, score_kind="mean_logprob", calibrator=calibrator, window=WINDOW)
    decision, _ = run_policy(policy, events)
    assert (decision.escalated, decision.decided_at_token) == (expected_escalated, expected_point)
    assert_same_confidence(decision.confidence, expected_confidence)


def test_every_token_escalates_at_the_first_dip_after_k():
    events = [make_event(math.log(0.9))] * 6 + [make_event(math.log(0.01))] * 4
    policy = StreamingPolicy(0.8, 3, score_kind="min_prob")
    outcomes = [policy.observe(event) for event in events[:7]]
    assert outcomes[:6] == [None] * 6
    assert outcomes[6].escalated and outcomes[6].decided_at_token == 7
    with pytest.raises(RuntimeError, match="already escalated"):
        policy.observe(events[7])


def test_first_k_settles_local_at_k_and_ignores_later_dips():
    events = [make_event(math.log(0.9))] * 4 + [make_event(math.log(0.01))] * 4
    policy = StreamingPolicy(0.8, 4, score_kind="min_prob", decide_at="first_k")
    assert all(policy.observe(event) is None for event in events)
    decision = policy.finish()
    assert not decision.escalated and decision.decided_at_token == 4
    assert policy.running.num_tokens == 8  # still tracked for a post-generation verifier
    with pytest.raises(RuntimeError, match="finished"):
        policy.observe(events[0])


def test_an_answer_shorter_than_k_is_judged_at_its_end():
    policy = StreamingPolicy(0.5, 10)
    assert policy.observe(make_event(math.log(0.1))) is None
    decision = policy.finish()
    assert decision.escalated and decision.decided_at_token == 1


def test_an_empty_answer_escalates_unless_threshold_is_zero():
    assert StreamingPolicy(0.3, 2).finish().escalated
    assert not StreamingPolicy(0.0, 2).finish().escalated


@pytest.mark.parametrize(
    "kwargs, message_part",
    [
        ({"min_tokens_k": 0}, "min_tokens_k"),
        ({"score_kind": "median"}, "unknown score_kind"),
        ({"score_kind": "mean_entropy"}, "calibrator"),
        ({"score_kind": "mean_logprob"}, "calibrator"),
        ({"decide_at": "sometimes"}, "decide_at"),
        ({"threshold": 1.5}, "threshold"),
    ],
)
def test_bad_configuration_is_refused_with_a_fix(kwargs, message_part):
    arguments = {"threshold": 0.5, "min_tokens_k": 4, **kwargs}
    with pytest.raises(ValueError, match=message_part):
        StreamingPolicy(**arguments)


# -- a learned probe as the score ------------------------------------------------------------------


def test_score_fn_replaces_score_kind_and_sees_all_features():
    seen = []

    def probe(features):
        seen.append(dict(features))
        return 0.3

    policy = StreamingPolicy(0.5, min_tokens_k=2, score_fn=probe)
    assert policy.observe(TokenEvent("r", 1, "a", -0.1, 0.2, 0.9)) is None  # before K: not consulted
    decision = policy.observe(TokenEvent("r", 2, "b", -0.1, 0.2, 0.9))
    assert decision.escalated and decision.confidence == 0.3 and "probe" in decision.detail
    assert len(seen) == 1 and seen[0]["num_tokens"] == 2 and "mean_prob" in seen[0]


def test_score_fn_must_be_a_probability_and_takes_no_calibrator():
    with pytest.raises(ValueError, match="calibrator"):
        StreamingPolicy(0.5, 1, score_fn=lambda f: 0.5, calibrator=object())
    policy = StreamingPolicy(0.5, 1, score_fn=lambda f: 1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        policy.observe(TokenEvent("r", 1, "a", -0.1, 0.2, 0.9))


@pytest.mark.parametrize("decide_at", ["every_token", "end", "first_k"])
def test_a_loop_escalates_whatever_the_confidence(decide_at):
    """Confident tokens (p = 0.99) on repeat: escalated with reason "repetition" where the rule
    fires (before any first_k pass settles the request), unless the rule is off or threshold 0."""
    ids = [1, 2, 3] + [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22] * 4
    events = [make_event(math.log(0.99), 0.9, token_id) for token_id in ids]
    fires_at = find_loop(ids, ESCALATE_LOOP)[0]
    assert fires_at == 3 + 26  # two copies of the 13-token unit
    for threshold, loop_rule, min_tokens_k, expected in [
        (0.5, ESCALATE_LOOP, 40, fires_at),  # K after the loop: first_k has not settled anything yet
        (0.5, None, 40, None),
        (0.0, ESCALATE_LOOP, 40, None),
        (0.5, ESCALATE_LOOP, 8, None if decide_at == "first_k" else fires_at),  # a pass at K = 8 settles first_k
    ]:
        policy = StreamingPolicy(threshold, min_tokens_k, decide_at=decide_at, loop_rule=loop_rule)
        at, decision = None, None
        for n, event in enumerate(events, start=1):
            if (decision := policy.observe(event)) is not None:
                at = n
                break  # the caller stops feeding an escalated answer
        if expected is None:
            assert decision is None
            continue
        assert (at, decision.reason, decision.tier, decision.decided_at_token) == (
            expected,
            Reason.REPETITION,
            Tier.CLOUD,
            expected,
        )
        assert policy.finish() is decision
