"""Policies that decide before the local model generates anything.

Each returns a RoutingDecision, or None for "no opinion, ask the next policy". A
decision here is final: nothing later in the cascade can override it. The recommended
order is PrivateFirst, ForcedTier, ThresholdOnePolicy, ToolTurns, PromptRouterPolicy; the cascade
refuses any order that puts a policy before PrivateFirst, so a private request never
reaches the cloud, whatever the model name or threshold says.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from router.decision import (
    Reason,
    RoutingDecision,
    RoutingMode,
    Tier,
    should_escalate,
    validate_threshold,
)


@dataclass(frozen=True)
class RequestContext:
    """What the pre-generation policies may look at."""

    prompt_text: str  # the request's text as privacy rules and prompt scorers read it (all messages)
    mode: RoutingMode = RoutingMode.AUTO  # from the model name (router.decision.parse_model_choice)
    flagged_private: bool = False  # the request itself asked to stay on the device
    tool_choice: str | None = None  # tools offered: "auto" (text or calls) or "required" (calls only); None: no tools


class PreGenerationPolicy(Protocol):
    """Decides from the request alone, or returns None to let the next policy decide."""

    name: str  # recorded as RoutingDecision.decided_by

    def decide(self, context: RequestContext) -> RoutingDecision | None: ...


class PrivateFirst:
    """Keeps requests that match a privacy rule, or are flagged private, on the device."""

    name = "private_first"

    def __init__(self, matched_rules: Callable[[str], Iterable[str]]):
        self.matched_rules = matched_rules  # prompt text -> names of the rules it matches (empty: not private)

    def decide(self, context: RequestContext) -> RoutingDecision | None:
        rule_names = list(self.matched_rules(context.prompt_text))
        if context.flagged_private:
            rule_names.insert(0, "private_flag")
        if not rule_names:
            return None
        return RoutingDecision(
            tier=Tier.LOCAL,
            escalated=False,
            reason=Reason.PRIVATE,
            detail="kept on the device by: " + ", ".join(rule_names),
            decided_by=self.name,
        )


class ForcedTier:
    """Honors a model name of "local" or "cloud" (or a tier fixed by the deployment)."""

    name = "forced_tier"

    def __init__(self, tier: Tier | None = None):
        self.tier = tier  # None: take the tier from the request's model name

    def decide(self, context: RequestContext) -> RoutingDecision | None:
        tier = self.tier
        if tier is None and context.mode is not RoutingMode.AUTO:
            tier = Tier(context.mode.value)
        if tier is None:
            return None
        return RoutingDecision(
            tier=tier, escalated=False, reason=Reason.FORCED, detail=f"model {tier}", decided_by=self.name
        )


class ThresholdOnePolicy:
    """Threshold 1 always escalates, so skip the local generation entirely."""

    name = "threshold_one"

    def __init__(self, threshold: float):
        self.threshold = validate_threshold(threshold)

    def decide(self, context: RequestContext) -> RoutingDecision | None:
        if self.threshold < 1.0:
            return None
        return RoutingDecision(
            tier=Tier.CLOUD,
            escalated=True,
            reason=Reason.THRESHOLD_ONE,
            detail="threshold 1 sends every request to the cloud",
            decided_by=self.name,
        )


class ToolTurns:
    """Where turns that offer tools go (the deployment's `tool_calls` setting).

    "local": like any other turn. "cloud": every such turn goes to the cloud. "auto": a turn that
    may answer in text (tool_choice auto) goes to the cloud, because the embedded 135M model almost
    never chooses to call a tool when it may answer in prose (bench.structured's
    tool_call_rate_auto_local); a turn that must call (required, or a named function) runs locally,
    where the grammar makes every call valid. Threshold 0 never escalates."""

    name = "tool_turns"
    MODES = ("auto", "local", "cloud")

    def __init__(self, mode: str, threshold: float):
        if mode not in self.MODES:
            raise ValueError(f"tool_calls must be one of {', '.join(self.MODES)}, got {mode!r}")
        self.mode, self.threshold = mode, validate_threshold(threshold)

    def decide(self, context: RequestContext) -> RoutingDecision | None:
        if context.tool_choice is None or self.mode == "local" or self.threshold == 0.0:
            return None
        if self.mode == "auto" and context.tool_choice != "auto":
            return None
        return RoutingDecision(
            tier=Tier.CLOUD,
            escalated=True,
            reason=Reason.TOOL_CALLS,
            decided_by=self.name,
            detail=f"tool_calls = {self.mode}: tool_choice {context.tool_choice} goes to the cloud",
        )


class PromptRouterPolicy:
    """Escalates prompts a scorer judges too hard for the local tier (RouteLLM-style).

    `score_fn(prompt_text)` is the need for the strong tier in [0, 1] (e.g. the
    predicted probability that the cloud answer wins). Its confidence in the local tier
    is 1 - score, judged by the shared rule: escalate iff 1 - score < threshold, so
    threshold 0 never and threshold 1 always escalates. A prompt it does not escalate
    gets no opinion (None): the streaming and post-generation policies still watch it.
    """

    name = "prompt_router"

    def __init__(self, score_fn: Callable[[str], float], threshold: float):
        self.score_fn = score_fn  # prompt text -> need for the strong tier in [0, 1]
        self.threshold = validate_threshold(threshold)

    def decide(self, context: RequestContext) -> RoutingDecision | None:
        score = float(self.score_fn(context.prompt_text))
        if math.isnan(score) or not 0.0 <= score <= 1.0:
            raise ValueError(f"prompt router score must be in [0, 1] (need for the cloud tier), got {score!r}")
        confidence = 1.0 - score
        if not should_escalate(confidence, self.threshold):
            return None
        return RoutingDecision(
            tier=Tier.CLOUD,
            escalated=True,
            reason=Reason.PROMPT_ROUTER,
            confidence=confidence,
            detail=f"prompt score {score:.3f} for the cloud tier; local confidence below threshold {self.threshold:g}",
            decided_by=self.name,
        )
