"""The cascade's answers in OpenAI's shapes, plus the `tandem` routing field: what
sdk.cascade.openai builds and sdk.client returns to apps."""

from __future__ import annotations

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
    """The `tandem` extension: the routing decision, and tokens and USD per tier."""
    return {
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


def usage_of(routing: RoutingInfo, num_completion_tokens: int) -> Usage:
    """Usage as the answering tier saw it: its prompt, and every token released to the app."""
    prompt_tokens = int(routing.cost.get(routing.tier, {}).get("prompt_tokens", 0))
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=num_completion_tokens,
        total_tokens=prompt_tokens + num_completion_tokens,
    )
