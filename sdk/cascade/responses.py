"""The cascade's answers in OpenAI's shapes, plus the `tandem` routing field: what
sdk.cascade.openai builds and sdk.client returns to apps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sdk.cascade.types import RoutingInfo
from sdk.protocol.openai_schema import ChatCompletionChunk, ChatCompletionResponse, Usage


class TandemChatCompletion(ChatCompletionResponse):
    """chat.completion plus `tandem`: how the cascade routed the request."""

    tandem: dict[str, Any]


class TandemChatCompletionChunk(ChatCompletionChunk):
    """chat.completion.chunk; the last chunk of a stream also carries `tandem`."""

    tandem: dict[str, Any] | None = None


def tandem_field(routing: RoutingInfo) -> dict[str, Any]:
    """The `tandem` extension: the routing decision, and tokens and USD per tier (and, with draft_on_device,
    the device's drafting of the cloud answer, or why there was none)."""
    field = {
        "tier": routing.tier,
        "escalated": routing.escalated,
        "reason": routing.reason,
        "confidence": routing.confidence,
        "decided_at_token": routing.decided_at_token,
        "handoff": routing.handoff,
        "degraded": routing.degraded,
        "degraded_reason": routing.degraded_reason,
        "privacy_reasons": list(routing.privacy_reasons),
        "num_redactions": routing.num_redactions,
        "cost": dict(routing.cost),
    }
    if routing.drafts is not None:
        field["drafts"] = dict(routing.drafts)
    if routing.draft_refused is not None:
        field["draft_refused"] = routing.draft_refused
    return field


def usage_of(routing: RoutingInfo, tiers: Sequence[str]) -> Usage:
    """Usage as the answering tier saw it: its prompt, and the completion tokens released to the app.

    `tiers`: the tier of each event released. The local tier's events are its tokens; the cloud's
    part is the cloud's own count (the cost ledger's), since an OpenAI-compatible cloud's chunks are
    not tokens one to one (llama.cpp's servers end with a chunk that only carries the finish_reason)."""
    prompt_tokens = int(routing.cost.get(routing.tier, {}).get("prompt_tokens", 0))
    num_local = sum(tier == "local" for tier in tiers)
    num_cloud_events = len(tiers) - num_local
    cloud_count = routing.cost.get("cloud", {}).get("completion_tokens")
    num_cloud = int(cloud_count) if num_cloud_events and cloud_count is not None else num_cloud_events
    completion_tokens = num_local + num_cloud
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )
