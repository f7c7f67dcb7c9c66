"""POST /v1/completions for the routed models (`auto`, `auto:<threshold>`, `cloud`): a raw prompt through
the cascade (sdk.cascade.prompt.RawPrompt), continued as it is on either tier, without a chat template.

This is how a base model (no chat template, e.g. Gemma-3-270M) escalates: the device answers, the router
judges its tokens, and the cloud continues the same text (handoff "continue": after the device's token
ids) or answers it afresh, and with draft_on_device the device drafts the cloud's answer. The answer is
OpenAI's text_completion (or its chunks) plus the `tandem` routing field. As on the routed chat models:
one choice and no logprobs (neither survives a hand-off), logit_bias only when the tiers share a
vocabulary. A token-id prompt goes to the cloud only when the tiers share one (`cloud_vocabulary_differs`).
Model `local` (and the local model's own name) answers on the engine directly, with every field.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from sdk.cascade.prompt import RawPrompt
from sdk.cascade.responses import tandem_field, usage_of
from sdk.cascade.types import CascadeEvent, collect
from sdk.openai_server.errors import from_exception
from sdk.openai_server.routed_chat import budget_headers
from sdk.openai_server.serving import ServerState, await_for_client, new_id
from sdk.openai_server.streaming import DONE, EventStreamResponse, sse
from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema import CompletionChoice, CompletionRequest, CompletionResponse


async def create_routed_completion(
    request: Request, state: ServerState, body: CompletionRequest, model: str
) -> Response:
    runner = state.cascade
    response_id, created = new_id("cmpl"), int(time.time())
    try:
        shared = await runner.shares_vocabulary() if body.logit_bias else False
        _check_routable(body, model, runner.local.model_name, shared)
        prompt = RawPrompt.of(runner.local, body.single_prompt())
        params = body.sampling_params()
    except Exception as exc:
        return from_exception(exc).response()
    key = getattr(request.state, "key_fingerprint", None)
    headers = await budget_headers(runner, key, body.user)
    events = runner.generate(
        prompt,
        params,
        model=model,
        private=bool(body.private),
        request_id=response_id,
        streamed=bool(body.stream),
        key_fingerprint=key,
        user=body.user,
    )
    extension = {"ignored_fields": body.ignored_fields} if body.ignored_fields else {}

    async def answer() -> Response:
        if body.stream:
            first = await anext(events, None)
            chunks = _chunks(events, first, response_id, created, model, body.include_usage, extension)
            return EventStreamResponse(chunks, headers=headers)
        result = await collect(events)
        completion = CompletionResponse(
            id=response_id,
            created=created,
            model=model,
            choices=[
                CompletionChoice(
                    index=0, text=result.text, finish_reason=result.finish_reason, stop_reason=result.stop_reason
                )
            ],
            usage=usage_of(result.routing, result.tiers),
            tandem={**tandem_field(result.routing), **extension},
        )
        return Response(completion.model_dump_json(), media_type="application/json", headers=headers)

    return await await_for_client(request, state, answer(), events)


def _check_routable(body: CompletionRequest, model: str, local_model_name: str, shares_vocabulary: bool) -> None:
    """What a routed completion cannot offer (as sdk.cascade.openai.check_routable for chat), by field."""
    use_local = f"use {local_model_name!r} or 'local' (the local model without routing)"
    if body.num_choices > 1:
        raise InvalidRequestError(
            f"n > 1 is not supported for the routed model {model!r}; send n = 1, or {use_local}", "n"
        )
    if body.logprobs is not None:
        raise InvalidRequestError(
            f"logprobs are not available for the routed model {model!r} (the tiers' tokens do not survive a "
            f"hand-off); {use_local}",
            "logprobs",
        )
    if body.logit_bias and not shares_vocabulary:
        raise InvalidRequestError(
            f"logit_bias is not available for the routed model {model!r}: its token ids belong to one tier's "
            f"vocabulary, and the cloud tier's is another (or has not said which it is); {use_local}",
            "logit_bias",
        )


async def _chunks(
    events: AsyncIterator[CascadeEvent],
    first: CascadeEvent | None,
    response_id: str,
    created: int,
    model: str,
    include_usage: bool,
    extension: dict,
) -> AsyncIterator[str]:
    """The SSE body: a chunk per piece of text, the finish in a chunk of its own with the `tandem` field,
    OpenAI's usage chunk when asked for, [DONE]. An error after the 200 becomes an error event."""

    def chunk(choices: list[CompletionChoice], **extra) -> CompletionResponse:
        return CompletionResponse(id=response_id, created=created, model=model, choices=choices, **extra)

    tiers: list[str] = []  # the tier of each event released
    try:
        event = first
        while True:
            if event is None:
                raise RuntimeError("the cascade stream ended without its final routing event")
            if event.routing is not None:
                finish = CompletionChoice(
                    index=0, text="", finish_reason=event.finish_reason, stop_reason=event.stop_reason
                )
                yield sse(chunk([finish], tandem={**tandem_field(event.routing), **extension}))
                if include_usage:
                    yield sse(chunk([], usage=usage_of(event.routing, tiers)))
                break
            tiers.append(event.tier)
            if event.text:
                yield sse(chunk([CompletionChoice(index=0, text=event.text)]))
            event = await anext(events, None)
    except Exception as exc:  # the status line went out already: an error event, as the engine path does
        yield sse(from_exception(exc).body())
    finally:
        await events.aclose()  # a client that stops reading early cancels the generation
    yield DONE
