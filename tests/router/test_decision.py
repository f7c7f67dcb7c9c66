"""RoutingDecision invariants, the shared threshold rule, and the model-name grammar."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.decision import (
    HandoffMode,
    ModelChoiceError,
    Reason,
    RoutingDecision,
    RoutingMode,
    Tier,
    parse_model_choice,
    should_escalate,
    validate_threshold,
)
from sdk.protocol.engine import InvalidRequestError

confidences = st.floats(min_value=0.0, max_value=1.0) | st.just(math.nan)


@pytest.mark.parametrize(
    "model, expected",
    [
        ("auto", (RoutingMode.AUTO, None)),
        ("local", (RoutingMode.LOCAL, None)),
        ("cloud", (RoutingMode.CLOUD, None)),
        ("auto:0.35", (RoutingMode.AUTO, 0.35)),
        ("auto:0", (RoutingMode.AUTO, 0.0)),
        ("auto:1", (RoutingMode.AUTO, 1.0)),
        (" AUTO:0.5 ", (RoutingMode.AUTO, 0.5)),
    ],
)
def test_parse_model_choice_accepts_the_grammar(model, expected):
    assert parse_model_choice(model) == expected


@pytest.mark.parametrize(
    "model, message_part",
    [
        ("gpt-4o", "unknown model"),
        ("", "unknown model"),
        ("local:0.3", 'only applies to "auto"'),
        ("cloud:1", 'only applies to "auto"'),
        ("auto:", "is not a number"),
        ("auto:abc", "is not a number"),
        ("auto:1.5", "[0, 1]"),
        ("auto:-0.1", "[0, 1]"),
        ("auto:nan", "[0, 1]"),
        ("auto:inf", "[0, 1]"),
        (None, "must be a string"),
    ],
)
def test_parse_model_choice_rejects_with_a_clear_error(model, message_part):
    with pytest.raises(ModelChoiceError) as caught:
        parse_model_choice(model)
    assert message_part in str(caught.value)
    # The SDK maps it to HTTP 400 on the model parameter; plain callers can catch ValueError.
    assert isinstance(caught.value, InvalidRequestError) and isinstance(caught.value, ValueError)
    assert caught.value.param == "model"


@given(confidences)
def test_threshold_zero_never_and_one_always_escalates(confidence):
    assert should_escalate(confidence, 0.0) is False
    assert should_escalate(confidence, 1.0) is True


@given(confidences, st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True))
def test_in_between_escalates_below_the_threshold_and_on_nan(confidence, threshold):
    expected = math.isnan(confidence) or confidence < threshold
    assert should_escalate(confidence, threshold) is expected


@pytest.mark.parametrize("bad", [-0.01, 1.01, math.nan, math.inf, True, "0.5", None])
def test_validate_threshold_refuses_values_outside_zero_one(bad):
    with pytest.raises(ValueError, match="threshold"):
        validate_threshold(bad)


def test_validate_threshold_returns_a_float():
    assert validate_threshold(1) == 1.0 and isinstance(validate_threshold(1), float)


def test_routing_decision_invariants():
    with pytest.raises(ValueError, match="cloud"):
        RoutingDecision(tier=Tier.LOCAL, escalated=True, reason=Reason.LOW_CONFIDENCE)
    with pytest.raises(ValueError, match="escalation"):
        RoutingDecision(tier=Tier.CLOUD, escalated=False, reason=Reason.FORCED, handoff=HandoffMode.RESTART)
    escalation = RoutingDecision(tier=Tier.CLOUD, escalated=True, reason=Reason.LOW_CONFIDENCE, decided_at_token=9)
    handed_off = escalation.with_handoff(HandoffMode.CONTINUE)
    assert handed_off.handoff is HandoffMode.CONTINUE and handed_off.decided_at_token == 9
    assert escalation.handoff is None  # frozen: with_handoff made a copy
    with pytest.raises(AttributeError):
        escalation.tier = Tier.LOCAL


def test_choices_print_and_serialize_as_their_values():
    assert f"{Tier.CLOUD}" == "cloud" and str(HandoffMode.RESTART) == "restart"
    assert (
        json.dumps({"tier": Tier.LOCAL, "handoff": HandoffMode.CONTINUE}) == '{"tier": "local", "handoff": "continue"}'
    )
    assert Tier("cloud") is Tier.CLOUD and Tier.CLOUD == "cloud"
