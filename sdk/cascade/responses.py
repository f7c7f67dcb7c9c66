"""Request validation and response shapes for sdk.client, shared with the HTTP server.

Requests go through the server's own ChatCompletionRequest, so an embedded app and an
HTTP client get the same 400s and the same SamplingParams for the same arguments."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from router.decision import parse_model_choice
from sdk.cascade_types import RoutingInfo
from sdk.engine_protocol import EngineProtocol, InvalidRequestError, SamplingParams
from sdk.openai_schema import ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, Usage
from sdk.openai_server.errors import from_validation_errors


class TandemChatCompletion(ChatCompletionResponse):
    """chat.completion plus `tandem`: how the cascade routed the request."""

    tandem: dict[str, Any]


class TandemChatCompletionChunk(ChatCompletionChunk):
    """chat.completion.chunk; the last chunk of a stream also carries `tandem`."""

    tandem: dict[str, Any] | None = None


def build_request(
    engine: EngineProtocol, model: str, messages: list, private: bool, fields: dict[str, Any]
) -> tuple[list[dict], SamplingParams]:
    """Validate the arguments the way the server validates a body; InvalidRequestError names the param."""
    if not isinstance(model, str):
        raise InvalidRequestError(f"model must be a string, got {type(model).__name__}", "model")
    parse_model_choice(model)  # raised here, not on the first event: a bad model fails create() itself
    if not isinstance(private, bool):
        raise InvalidRequestError(f"private must be a boolean, got {type(private).__name__}", "private")
    body = {"model": model, "messages": messages, **{k: v for k, v in fields.items() if v is not None}}
    try:
        # Through JSON, exactly like an HTTP body: strict types, no silent coercion.
        request = ChatCompletionRequest.model_validate_json(json.dumps(body))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            error = from_validation_errors(exc.errors(include_url=False))
            raise InvalidRequestError(error.info.message, error.info.param) from None
        raise InvalidRequestError(f"arguments must be JSON values: {exc}", "messages") from None
    from sdk.cascade_openai import prepare  # here: sdk.cascade_openai imports this module

    return prepare(engine, request)


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
