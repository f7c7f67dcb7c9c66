"""Routing structured and tool-calling requests: the tool-call policy (router.pre_generation.ToolTurns),
the invalid_structure escalation (a structured local answer cut off by max_tokens cannot parse),
and confidence that skips the tokens a grammar forced."""

from __future__ import annotations

import dataclasses
import math

import pytest

from router.decision import Reason, Tier
from router.pre_generation import RequestContext, ToolTurns
from router.streaming_policy import StreamingPolicy
from sdk.protocol.engine import TokenEvent


@pytest.mark.parametrize(
    "mode, tool_choice, to_cloud",
    [
        ("auto", "auto", True),
        ("auto", "required", False),
        ("auto", None, False),
        ("cloud", "auto", True),
        ("cloud", "required", True),
        ("cloud", None, False),
        ("local", "auto", False),
        ("local", "required", False),
    ],
)
def test_tool_turns_route_by_mode_and_choice(mode, tool_choice, to_cloud):
    decision = ToolTurns(mode, 0.5).decide(RequestContext("hi", tool_choice=tool_choice))
    if to_cloud:
        assert (decision.tier, decision.escalated, decision.reason) == (Tier.CLOUD, True, Reason.TOOL_CALLS)
    else:
        assert decision is None


def test_threshold_zero_keeps_tool_turns_local_and_bad_modes_are_refused():
    assert ToolTurns("cloud", 0.0).decide(RequestContext("hi", tool_choice="auto")) is None
    with pytest.raises(ValueError, match="tool_calls"):
        ToolTurns("sometimes", 0.5)


def event(finish_reason=None) -> TokenEvent:
    return TokenEvent(
        request_id="r", token_id=7, text="x", logprob=-0.01, entropy=0.1, margin=0.9, finish_reason=finish_reason
    )


@pytest.mark.parametrize(
    "structured, finish, threshold, escalates",
    [
        (True, "length", 0.5, True),
        (True, "stop", 0.5, False),
        (False, "length", 0.5, False),
        (True, "length", 0.0, False),
    ],
)
def test_a_structured_answer_cut_by_max_tokens_escalates_as_invalid_structure(structured, finish, threshold, escalates):
    policy = StreamingPolicy(threshold, min_tokens_k=2, structured=structured)
    assert [policy.observe(event()) for _ in range(5)] == [None] * 5  # confident tokens
    decision = policy.observe(event(finish))
    if escalates:
        assert (decision.reason, decision.decided_at_token, decision.escalated) == (Reason.INVALID_STRUCTURE, 6, True)
    else:
        assert decision is None and policy.finish().reason != Reason.INVALID_STRUCTURE


def test_a_request_settled_local_at_k_is_not_reopened():
    policy = StreamingPolicy(0.5, min_tokens_k=2, decide_at="first_k", structured=True)
    for _ in range(3):
        assert policy.observe(event()) is None
    assert policy.observe(dataclasses.replace(event(), finish_reason="length")) is None
    assert policy.finish().reason == Reason.CONFIDENT


def test_forced_tokens_are_counted_but_not_judged():
    """Twenty forced tokens the model found unlikely (the mask chose them) neither lower the
    confidence nor count towards min_tokens_k; decided_at_token counts every token."""
    unlikely_forced = dataclasses.replace(event(), logprob=-9.0, forced=True)
    policy = StreamingPolicy(0.5, min_tokens_k=3)
    assert [policy.observe(unlikely_forced) for _ in range(20)] == [None] * 20
    assert (policy.running.num_tokens, policy.running.num_seen) == (0, 20)
    for _ in range(3):
        assert policy.observe(event()) is None
    decision = policy.finish()
    assert decision.reason == Reason.CONFIDENT and decision.decided_at_token == 23
    assert policy.confidence() == pytest.approx(math.exp(-0.01))
    unforced = StreamingPolicy(0.5, min_tokens_k=3)
    escalation = [unforced.observe(dataclasses.replace(unlikely_forced, forced=False)) for _ in range(3)][-1]
    assert escalation.reason == Reason.LOW_CONFIDENCE  # the same tokens, chosen by the model: not confident
