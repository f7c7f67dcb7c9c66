"""What the cascade runner streams back: tokens from either tier, then the routing metadata."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoutingInfo:
    """How one request was routed; attached to the final CascadeEvent."""

    tier: str  # "local" or "cloud": who produced the end of the answer
    escalated: bool  # the router moved an "auto" request to the cloud (even if the cloud then failed)
    reason: str  # router.decision.Reason value, or "committed_local" (escalation came after tokens were released)
    confidence: float | None = None  # confidence the decision was based on
    decided_at_token: int | None = None  # local tokens generated when decided; None before generation
    handoff: str | None = None  # "restart" / "continue" for escalations after local tokens
    degraded: bool = False  # the cloud should have answered but could not: the local tier did
    # cloud_unavailable, cloud_first_token_timeout, cloud_stall_timeout, cloud_deadline, cloud_auth, circuit_open, ...
    degraded_reason: str | None = None
    privacy_reasons: tuple[str, ...] = ()  # rules (or "private_flag") that kept the request local
    num_redactions: int = 0  # spans replaced by placeholders before escalating
    decided_by: str = ""  # the policy that decided
    detail: str = ""
    cost: dict = field(default_factory=dict)  # router.costs.RequestCost.as_dict(): tokens and USD per tier
    drafts: dict | None = None  # draft_on_device: sdk.cascade.device_drafts.DraftRounds.as_dict() of the cloud answer
    draft_refused: str | None = None  # draft_on_device: why the cloud answered without the device's drafts


@dataclass
class CascadeEvent:
    """One piece of the answer released to the client, or the final event (routing set)."""

    text: str  # text this event adds (may be empty)
    token_id: int | None  # None on the final event
    tier: str  # which tier produced it
    finish_reason: str | None = None  # set on the final event only: "stop", "length" or "abort"
    routing: RoutingInfo | None = None  # set on the final event only
    stop_reason: str | None = None  # final event: "repetition" when a loop was stopped (finish_reason "length")


@dataclass
class CascadeResult:
    """A whole answer, collected from the stream (tests, non-streamed requests)."""

    text: str
    token_ids: list[int]
    tiers: list[str]  # tier of each token, in order
    finish_reason: str | None
    routing: RoutingInfo
    stop_reason: str | None = None


async def collect(events) -> CascadeResult:
    """Drain a CascadeRunner.generate stream into one result."""
    texts, token_ids, tiers = [], [], []
    final: CascadeEvent | None = None
    try:
        async for event in events:
            if event.routing is not None:
                final = event
                continue
            texts.append(event.text)
            token_ids.append(event.token_id)
            tiers.append(event.tier)
    finally:
        await events.aclose()  # cancelled part-way (a client that left): stop both tiers now
    if final is None:
        raise RuntimeError("the cascade stream ended without its final routing event")
    return CascadeResult("".join(texts), token_ids, tiers, final.finish_reason, final.routing, final.stop_reason)
