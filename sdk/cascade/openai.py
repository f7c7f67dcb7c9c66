"""Cascade answers in OpenAI's shapes: shared by sdk.client (in-process apps) and the HTTP
server's routed models (`tandem serve` with model auto / local / cloud).

    messages, params = await prepare_routed(runner, request, "auto")  # a validated ChatCompletionRequest
    reply = await routed_completion(runner, messages, params, model="auto", ...)
    async for chunk in await routed_stream(runner, messages, params, model="auto", ...): ...

A stream's last chunk carries finish_reason, usage and the `tandem` routing field; the
HTTP server moves usage into OpenAI's separate usage chunk when the client asked for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sdk.cascade.runner import CascadeRunner
from sdk.cascade.types import CascadeEvent, collect
from sdk.cascade.responses import TandemChatCompletion, TandemChatCompletionChunk, tandem_field, usage_of
from sdk.protocol.engine import EngineProtocol, InvalidRequestError, SamplingParams
from sdk.protocol.openai_schema import ChatChoice, ChatChunkChoice, ChatCompletionRequest, ChatResponseMessage, DeltaMessage


def check_routable(request: ChatCompletionRequest, model: str, local_model_name: str, shares_vocabulary: bool = False) -> None:
    """Refuse what a routed model cannot offer: one choice, no logprobs (the tiers' vocabularies
    may differ, so neither survives a hand-off), logit_bias unless `shares_vocabulary`
    (CascadeRunner.shares_vocabulary); the local model's own name serves all three."""
    if request.num_choices > 1:
        raise InvalidRequestError(
            f"n > 1 is not supported for the routed model {model!r}; send n = 1, "
            f"or use {local_model_name!r} (the local model without routing)", "n",
        )  # fmt: skip
    if request.logit_bias and not shares_vocabulary:
        raise InvalidRequestError(
            f"logit_bias is not available for the routed model {model!r}: its token ids belong to one tier's "
            f"vocabulary, and the cloud tier's is another (or has not said which it is); use {local_model_name!r} "
            "(the local model without routing)", "logit_bias",
        )  # fmt: skip
    if request.logprobs:
        raise InvalidRequestError(
            f"logprobs are not available for the routed model {model!r} (the tiers have different "
            f"vocabularies); use {local_model_name!r} (the local model without routing)", "logprobs",
        )  # fmt: skip


async def prepare_routed(runner: CascadeRunner, request: ChatCompletionRequest, model: str) -> tuple[list[dict], SamplingParams]:
    """check_routable, asking the runner whether the tiers share a vocabulary only when logit_bias
    needs it, then prepare: what every front door of the cascade runs on a validated request."""
    shared = await runner.shares_vocabulary() if request.logit_bias else False
    check_routable(request, model, runner.local.model_name, shares_vocabulary=shared)
    return prepare(runner.local, request)


def prepare(engine: EngineProtocol, request: ChatCompletionRequest) -> tuple[list[dict], SamplingParams]:
    """Messages and sampling parameters of a validated request (InvalidRequestError names the param)."""
    message_dicts = request.message_dicts()
    # Only a missing max_tokens needs the prompt length (the default is what the context has left).
    missing_budget = request.max_tokens is None and request.max_completion_tokens is None
    num_prompt_tokens = len(engine.apply_chat_template(message_dicts)) if missing_budget else 0
    return message_dicts, request.sampling_params(num_prompt_tokens, engine.max_model_len)


async def routed_completion(
    runner: CascadeRunner, messages: list[dict], params: SamplingParams, *,
    model: str, private: bool, response_id: str, created: int,
) -> TandemChatCompletion:  # fmt: skip
    """The whole answer as one chat.completion with the `tandem` field."""
    events = runner.generate(messages, params, model=model, private=private, request_id=response_id)
    result = await collect(events)
    message = ChatResponseMessage(content=result.text)
    return TandemChatCompletion(
        id=response_id, created=created, model=model,
        choices=[ChatChoice(index=0, message=message, finish_reason=result.finish_reason,
                          stop_reason=result.stop_reason)],
        usage=usage_of(result.routing, len(result.token_ids)), tandem=tandem_field(result.routing),
    )  # fmt: skip


async def routed_stream(
    runner: CascadeRunner, messages: list[dict], params: SamplingParams, *,
    model: str, private: bool, response_id: str, created: int,
) -> AsyncIterator[TandemChatCompletionChunk]:  # fmt: skip
    """The answer as chat.completion.chunk objects.

    The first event is pulled before this returns, so a refused request (bad model, a
    prompt the cloud calls invalid) raises here, while a server can still answer 400."""
    events = runner.generate(messages, params, model=model, private=private, request_id=response_id)
    try:
        first = await anext(events, None)
    except BaseException:
        await events.aclose()
        raise
    return _chunks(events, first, response_id, created, model)


async def _chunks(
    events: AsyncIterator[CascadeEvent], first: CascadeEvent | None, response_id: str, created: int, model: str
) -> AsyncIterator[TandemChatCompletionChunk]:
    def chunk(delta: DeltaMessage, finish_reason=None, stop_reason=None, **extra) -> TandemChatCompletionChunk:
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish_reason, stop_reason=stop_reason)
        return TandemChatCompletionChunk(id=response_id, created=created, model=model, choices=[choice], **extra)

    num_tokens = 0
    try:
        yield chunk(DeltaMessage(role="assistant", content=""))  # OpenAI opens with the role
        event = first
        while True:
            if event is None:
                raise RuntimeError("the cascade stream ended without its final routing event")
            if event.routing is not None:
                routing = event.routing
                yield chunk(
                    DeltaMessage(), event.finish_reason, event.stop_reason,  # collect() ignores the final event's text too
                    usage=usage_of(routing, num_tokens), tandem=tandem_field(routing),
                )
                return
            num_tokens += 1
            if event.text:  # tokens whose text is held back (partial characters) need no chunk
                yield chunk(DeltaMessage(content=event.text))
            event = await anext(events, None)
    finally:
        await events.aclose()  # a client that stops reading early cancels the generation
