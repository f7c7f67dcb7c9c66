"""Routing policies composed into one cascade: before, during and after generation.

    cascade = compose(pre=[PrivateFirst(rules), ForcedTier(), ThresholdOnePolicy(t)],
                      streaming=StreamingPolicy(t, min_tokens_k=16), post=None)
    decision = cascade.before_generation(context)   # final when not None
    for event in local_stream:                       # only when the local tier runs
        if (escalation := cascade.observe(event)):   # stop local, hand off to the cloud
            break
    decision = cascade.finish()                      # the final RoutingDecision

Pre-generation policies run in order and the first decision wins and is final; then
the streaming policy may escalate at any token; then the post-generation verifier
judges the complete answer. `RoutingDecision.decided_by` names the policy that
decided. A cascade holds per-request state: build one per request (cheap).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from confidence import RunningConfidence
from router.decision import Reason, RoutingDecision, Tier
from router.post_generation import PostGenerationPolicy
from router.pre_generation import (
    ForcedTier,
    PreGenerationPolicy,
    PrivateFirst,
    PromptRouterPolicy,
    RequestContext,
    ThresholdOnePolicy,
    ToolTurns,
)
from router.streaming_policy import DecideAt, StreamingPolicy
from sdk.protocol.engine import TokenEvent

__all__ = [
    "Cascade",
    "DecideAt",
    "ForcedTier",
    "PostGenerationPolicy",
    "PreGenerationPolicy",
    "PrivateFirst",
    "PromptRouterPolicy",
    "RequestContext",
    "StreamingPolicy",
    "ThresholdOnePolicy",
    "ToolTurns",
    "compose",
]


class Cascade:
    """Runs the policies of one request in order and keeps the decision they reach."""

    name = "cascade"

    def __init__(
        self,
        pre: Sequence[PreGenerationPolicy] = (),
        streaming: StreamingPolicy | None = None,
        post: PostGenerationPolicy | None = None,
    ):
        self.pre = tuple(pre)  # asked in order before generation; the first decision wins
        self.streaming = streaming  # watches the local tokens; None: no early escalation
        self.post = post  # verifies the complete local answer; None: no final check
        _check_privacy_comes_first(self.pre)
        # One running aggregate serves both the streaming policy and the verifier.
        self.running = streaming.running if streaming is not None else RunningConfidence()
        self._pre_decision: RoutingDecision | None = None
        self._final: RoutingDecision | None = None
        self._asked_pre = False

    @property
    def decision(self) -> RoutingDecision | None:
        """The final decision once reached (before generation, on escalation, or at finish)."""
        return self._final

    def before_generation(self, context: RequestContext) -> RoutingDecision | None:
        """The first pre-generation decision (final), or None: run the local tier and observe it."""
        if self._asked_pre:
            raise RuntimeError("before_generation was already called; build one Cascade per request")
        self._asked_pre = True
        for policy in self.pre:
            decision = policy.decide(context)
            if decision is not None:
                self._pre_decision = self._final = decision
                return decision
        return None

    def observe(self, event: TokenEvent) -> RoutingDecision | None:
        """Take the next local token; returns an escalation (stop the local tier), or None."""
        self._require_pre()
        if self._pre_decision is not None:
            if self._pre_decision.tier is Tier.CLOUD:
                raise RuntimeError(
                    f"routed to the cloud before generation ({self._pre_decision.reason}); no local tokens expected"
                )
            self.running.update(event)  # forced/private local: tracked for the metadata only
            return None
        if self._final is not None:
            raise RuntimeError(f"already escalated at token {self._final.decided_at_token}; stop feeding local tokens")
        if self.streaming is None:
            self.running.update(event)
            return None
        escalation = self.streaming.observe(event)
        if escalation is not None:
            self._final = escalation
        return escalation

    def finish(self) -> RoutingDecision:
        """The final decision, once the local answer is complete (or already decided)."""
        self._require_pre()
        if self._final is not None:
            return self._final
        streaming_verdict = self.streaming.finish() if self.streaming is not None else None
        if streaming_verdict is not None and streaming_verdict.escalated:
            self._final = streaming_verdict
        elif self.post is not None:
            self._final = self.post.decide(self.running.features_dict())
        elif streaming_verdict is not None:
            self._final = streaming_verdict
        else:
            self._final = RoutingDecision(
                tier=Tier.LOCAL,
                escalated=False,
                reason=Reason.NO_POLICY,
                decided_at_token=self.running.num_tokens,
                detail="no streaming or post-generation policy configured",
                decided_by=self.name,
            )
        return self._final

    def route_recorded(self, context: RequestContext, events: Iterable[TokenEvent]) -> RoutingDecision:
        """The decision for a recorded local generation, as if it had streamed (evaluation, calibration)."""
        if self.before_generation(context) is not None and self._final.tier is Tier.CLOUD:
            return self._final
        for event in events:
            if self.observe(event) is not None:
                break
        return self.finish()

    def _require_pre(self) -> None:
        if not self._asked_pre:
            raise RuntimeError("call before_generation(context) first: privacy and forced tiers come before any token")


def compose(
    pre: Sequence[PreGenerationPolicy] = (),
    streaming: StreamingPolicy | None = None,
    post: PostGenerationPolicy | None = None,
) -> Cascade:
    """A cascade of these policies for one request (see the module docstring)."""
    return Cascade(pre=pre, streaming=streaming, post=post)


def _check_privacy_comes_first(pre: tuple[PreGenerationPolicy, ...]) -> None:
    # Position is the only guarantee that a private request never reaches the cloud.
    seen_other = None
    for policy in pre:
        if isinstance(policy, PrivateFirst):
            if seen_other is not None:
                raise ValueError(
                    f"PrivateFirst must come before {seen_other} in pre: otherwise a private request "
                    "could be routed to the cloud; put every PrivateFirst at the start of the list"
                )
        elif seen_other is None:
            seen_other = getattr(policy, "name", type(policy).__name__)
