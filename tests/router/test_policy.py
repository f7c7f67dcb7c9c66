"""Pre-generation policies, the post-generation verifier, and their composition."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from confidence.probe_runtime import OnnxProbe
from router.decision import Reason, RoutingMode, Tier
from router.policy import (
    Cascade,
    ForcedTier,
    PostGenerationPolicy,
    PrivateFirst,
    PromptRouterPolicy,
    RequestContext,
    StreamingPolicy,
    ThresholdOnePolicy,
    compose,
)
from sdk.protocol.engine import TokenEvent

PRIVATE_TEXT = "my ssn is 123-45-6789"


def make_event(prob: float, token_id: int = 7) -> TokenEvent:
    return TokenEvent(request_id="r", token_id=token_id, text="x", logprob=math.log(prob), entropy=0.5, margin=0.1)


def ssn_rule(text: str) -> list[str]:
    return ["ssn"] if "ssn" in text else []


def standard_pre(threshold: float) -> list:
    return [PrivateFirst(ssn_rule), ForcedTier(), ThresholdOnePolicy(threshold)]


@pytest.mark.parametrize("mode", list(RoutingMode))
@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_private_beats_forced_cloud_and_threshold_one(mode, threshold):
    cascade = compose(pre=standard_pre(threshold), streaming=StreamingPolicy(threshold, 1))
    decision = cascade.route_recorded(RequestContext(PRIVATE_TEXT, mode), [make_event(0.01)] * 5)
    assert (decision.tier, decision.escalated, decision.reason) == (Tier.LOCAL, False, Reason.PRIVATE)
    assert decision.decided_by == "private_first" and "ssn" in decision.detail
    assert cascade.running.num_tokens == 5  # the local answer was still tracked for the metadata


def test_a_request_flagged_private_stays_local_without_any_rule_matching():
    decision = PrivateFirst(ssn_rule).decide(RequestContext("hello", RoutingMode.CLOUD, flagged_private=True))
    assert (decision.tier, decision.reason) == (Tier.LOCAL, Reason.PRIVATE) and "private_flag" in decision.detail
    assert PrivateFirst(ssn_rule).decide(RequestContext("hello", RoutingMode.CLOUD)) is None


def test_private_first_must_come_first():
    with pytest.raises(ValueError, match="PrivateFirst must come before forced_tier"):
        Cascade(pre=[ForcedTier(), PrivateFirst(ssn_rule)])


def test_forced_tiers():
    local = compose(pre=standard_pre(1.0), streaming=StreamingPolicy(1.0, 1))
    decision = local.route_recorded(RequestContext("hi", RoutingMode.LOCAL), [make_event(0.01)] * 3)
    assert (decision.tier, decision.escalated, decision.reason, decision.decided_by) == (
        Tier.LOCAL,
        False,
        Reason.FORCED,
        "forced_tier",
    )
    cloud = compose(pre=standard_pre(0.0))
    decision = cloud.before_generation(RequestContext("hi", RoutingMode.CLOUD))
    assert (decision.tier, decision.escalated, decision.reason) == (Tier.CLOUD, False, Reason.FORCED)
    with pytest.raises(RuntimeError, match="no local tokens expected"):
        cloud.observe(make_event(0.9))
    assert ForcedTier().decide(RequestContext("hi", RoutingMode.AUTO)) is None
    assert ForcedTier(Tier.CLOUD).decide(RequestContext("hi", RoutingMode.AUTO)).tier is Tier.CLOUD


def test_threshold_one_skips_the_local_tier():
    assert ThresholdOnePolicy(0.99).decide(RequestContext("hi")) is None
    decision = ThresholdOnePolicy(1.0).decide(RequestContext("hi"))
    assert (decision.tier, decision.escalated, decision.reason) == (Tier.CLOUD, True, Reason.THRESHOLD_ONE)


@given(st.floats(min_value=0.0, max_value=1.0), st.floats(min_value=0.0, max_value=1.0))
def test_prompt_router_escalates_iff_local_confidence_is_below_threshold(score, threshold):
    decision = PromptRouterPolicy(lambda text: score, threshold).decide(RequestContext("hi"))
    if threshold == 0.0:
        assert decision is None
    elif threshold == 1.0:
        assert decision is not None
    else:
        assert (decision is not None) is (1.0 - score < threshold)
    if decision is not None:
        assert (decision.tier, decision.escalated, decision.reason) == (Tier.CLOUD, True, Reason.PROMPT_ROUTER)
        assert decision.confidence == 1.0 - score


def test_prompt_router_refuses_scores_outside_zero_one():
    with pytest.raises(ValueError, match="prompt router score"):
        PromptRouterPolicy(lambda text: 1.2, 0.5).decide(RequestContext("hi"))


def test_post_check_sees_the_whole_answer_and_escalates_below_threshold():
    seen = []

    def verifier(features):
        seen.append(dict(features))
        return 0.3

    rejecting = compose(pre=standard_pre(0.5), post=PostGenerationPolicy(verifier, 0.5))
    decision = rejecting.route_recorded(RequestContext("hi"), [make_event(0.9)] * 4)
    assert (decision.tier, decision.escalated, decision.reason) == (Tier.CLOUD, True, Reason.FINAL_CHECK)
    assert decision.decided_at_token == 4 and decision.confidence == 0.3
    assert seen[0]["num_tokens"] == 4.0 and math.isclose(seen[0]["mean_prob"], 0.9)
    accepting = compose(post=PostGenerationPolicy(verifier, 0.3))
    decision = accepting.route_recorded(RequestContext("hi"), [make_event(0.9)] * 4)
    assert (decision.tier, decision.reason, decision.decided_by) == (Tier.LOCAL, Reason.CONFIDENT, "post_check")


def test_post_check_from_a_probe_uses_its_feature_order():
    class RecordingProbe:  # OnnxProbe's own scoring code over a recording model instead of ONNX
        feature_names = ("min_prob", "made_up")
        features_from_mapping = OnnxProbe.features_from_mapping
        score_features = OnnxProbe.score_features

        def predict(self, row):
            self.row = row
            return 0.9

    probe = RecordingProbe()
    decision = PostGenerationPolicy.from_probe(probe, 0.5).decide({"num_tokens": 2.0, "min_prob": 0.25})
    assert not decision.escalated and probe.row[0] == 0.25 and math.isnan(probe.row[1])


def test_first_pre_decision_wins():
    cascade = compose(pre=[ThresholdOnePolicy(1.0), PromptRouterPolicy(lambda text: 1.0, 1.0)])
    assert cascade.before_generation(RequestContext("hi")).decided_by == "threshold_one"


def test_streaming_escalation_ends_the_cascade_before_the_post_check():
    calls = []
    cascade = compose(
        streaming=StreamingPolicy(0.5, 2, score_kind="min_prob"),
        post=PostGenerationPolicy(lambda features: calls.append(1) or 1.0, 0.5),
    )
    decision = cascade.route_recorded(RequestContext("hi"), [make_event(0.9), make_event(0.1), make_event(0.9)])
    assert (decision.reason, decision.decided_at_token, decision.decided_by) == (Reason.LOW_CONFIDENCE, 2, "streaming")
    assert calls == [] and cascade.running.num_tokens == 2


def test_post_check_overrides_a_streaming_pass():
    cascade = compose(
        streaming=StreamingPolicy(0.5, 1, score_kind="min_prob"),
        post=PostGenerationPolicy(lambda features: 0.1, 0.5),
    )
    assert cascade.route_recorded(RequestContext("hi"), [make_event(0.9)] * 3).reason == Reason.FINAL_CHECK


def test_streaming_pass_is_final_without_a_post_check():
    cascade = compose(streaming=StreamingPolicy(0.5, 1))
    decision = cascade.route_recorded(RequestContext("hi"), [make_event(0.9)] * 3)
    assert (decision.tier, decision.reason, decision.decided_by) == (Tier.LOCAL, Reason.CONFIDENT, "streaming")


def test_no_policies_means_local():
    decision = compose().route_recorded(RequestContext("hi"), [make_event(0.1)])
    assert (decision.tier, decision.reason, decision.decided_at_token) == (Tier.LOCAL, Reason.NO_POLICY, 1)


def test_cascade_call_order_is_enforced():
    cascade = compose(streaming=StreamingPolicy(0.5, 1))
    with pytest.raises(RuntimeError, match="before_generation"):
        cascade.observe(make_event(0.9))
    assert cascade.before_generation(RequestContext("hi")) is None
    with pytest.raises(RuntimeError, match="one Cascade per request"):
        cascade.before_generation(RequestContext("hi"))
    assert cascade.observe(make_event(0.1)).escalated
    with pytest.raises(RuntimeError, match="already escalated"):
        cascade.observe(make_event(0.9))
    assert cascade.finish() is cascade.decision
