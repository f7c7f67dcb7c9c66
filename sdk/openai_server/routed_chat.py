"""POST /v1/chat/completions for the routed models (`auto`, `auto:<threshold>`, `local`,
`cloud`): the request goes through the cascade runner instead of straight to the engine.

The answer is OpenAI's chat.completion (or its chunks) plus a `tandem` field saying how it
was routed. The body may carry `"private": true` (the openai package's `extra_body`) to
keep a request on the device. One choice per request and no logprobs: the tiers' token
streams do not share a vocabulary, so neither can be offered across a hand-off; the local
model's own name serves both without routing.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sdk.cascade.openai import RoutedChat, prepare_routed, routed_completion, routed_stream
from sdk.openai_server.errors import from_exception
from sdk.openai_server.serving import BUDGET_WARNING_HEADER, ServerState, await_for_client, new_id
from sdk.openai_server.streaming import DONE, EventStreamResponse, sse
from sdk.protocol.openai_schema import ChatCompletionRequest


async def create_routed_chat_completion(
    request: Request, state: ServerState, body: ChatCompletionRequest, model: str
) -> Response:
    ran = await run_routed(request, state, body, model, new_id("chatcmpl"), int(time.time()))
    if isinstance(ran, Response):
        return ran
    result, headers = ran
    if not body.stream:
        if body.ignored_fields:
            result.tandem["ignored_fields"] = body.ignored_fields
        return Response(result.model_dump_json(), media_type="application/json", headers=headers)
    return EventStreamResponse(_sse(result, body.include_usage, body.ignored_fields), headers=headers)


async def run_routed(
    request: Request,
    state: ServerState,
    body: ChatCompletionRequest,
    model: str,
    response_id: str,
    created: int,
    prepared: RoutedChat | None = None,
) -> tuple[Any, dict[str, str]] | Response:
    """A routed chat request through the cascade, for every front door that speaks chat underneath
    (/v1/chat/completions, /v1/responses): (the TandemChatCompletion, or its chunks when `body.stream`,
    with the budget headers), or the error Response to send (a refusal, an overload, a client gone).
    `prepared`: `body` already through prepare_routed (a front door that needed its privacy verdict first)."""
    runner = state.cascade
    try:
        chat = prepared if prepared is not None else await prepare_routed(runner, body, model)
    except Exception as exc:
        return from_exception(exc).response()
    key = getattr(request.state, "key_fingerprint", None)
    headers = await budget_headers(runner, key, body.user)
    args = dict(
        private=bool(body.private), response_id=response_id, created=created, key_fingerprint=key, user=body.user
    )
    if body.stream:  # its first chunk is pulled before the 200 goes out: a refusal is still an error status
        answer = routed_stream(runner, chat, model=model, **args)
    else:
        answer = routed_completion(runner, chat, model=model, **args)
    outcome = await await_for_client(request, state, answer)
    return outcome if isinstance(outcome, Response) else (outcome, headers)


async def budget_headers(runner, key: str | None, user: str | None) -> dict[str, str]:
    """`x-tandem-budget-warning` naming each soft budget this key (or user) has reached (counted in /metrics)."""
    warning = await runner.budgets.soft_warning(key, user) if runner.budgets is not None else None
    return {BUDGET_WARNING_HEADER: warning} if warning else {}


async def _sse(chunks, include_usage: bool, ignored_fields: list[str]):
    """The chunks as SSE; usage moves to OpenAI's own final chunk (choices: []) when asked for;
    the final chunk's `tandem` also lists the request fields that were ignored."""
    try:
        async for chunk in chunks:
            if chunk.tandem is not None and ignored_fields:
                chunk.tandem["ignored_fields"] = ignored_fields
            usage, chunk.usage = chunk.usage, None
            yield sse(chunk)
            if usage is not None and include_usage:
                yield sse(chunk.model_copy(update={"choices": [], "usage": usage, "tandem": None}))
    except Exception as exc:  # the status line went out already: an error event, as the engine path does
        yield sse(from_exception(exc).body())
    finally:
        await chunks.aclose()
    yield DONE
