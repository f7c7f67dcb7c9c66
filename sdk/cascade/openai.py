"""Cascade answers in OpenAI's shapes: shared by sdk.client (in-process apps) and the HTTP
server's routed models (`tandem serve` with model auto / local / cloud).

    chat = await prepare_routed(runner, request, "auto")  # a validated ChatCompletionRequest
    reply = await routed_completion(runner, chat, model="auto", ...)
    async for chunk in await routed_stream(runner, chat, model="auto", ...): ...

A stream's last chunk carries finish_reason, usage and the `tandem` routing field; the
HTTP server moves usage into OpenAI's separate usage chunk when the client asked for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple

from router.privacy import PrivacyVerdict
from sdk.cascade.runner import CascadeRunner
from sdk.cascade.types import CascadeEvent, collect
from sdk.cascade.responses import TandemChatCompletion, TandemChatCompletionChunk, tandem_field, usage_of
from sdk.serving.prompt_tokens import chat_prompt_tokens
from sdk.protocol.engine import EngineProtocol, InvalidRequestError, SamplingParams
from sdk.protocol.openai_schema import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionRequest,
    DeltaMessage,
)
from sdk.protocol.tool_calls import ToolAnswers
from sdk.protocol.tool_formats import tool_format_of


def check_routable(
    request: ChatCompletionRequest, model: str, local_model_name: str, shares_vocabulary: bool = False
) -> None:
    """Refuse what a routed model cannot offer: one choice, no logprobs (the tiers' vocabularies
    may differ, so neither survives a hand-off), logit_bias unless `shares_vocabulary`
    (CascadeRunner.shares_vocabulary); the local model's own name serves all three."""
    if request.num_choices > 1:
        raise InvalidRequestError(
            f"n > 1 is not supported for the routed model {model!r}; send n = 1, "
            f"or use {local_model_name!r} (the local model without routing)",
            "n",
        )
    if request.logit_bias and not shares_vocabulary:
        raise InvalidRequestError(
            f"logit_bias is not available for the routed model {model!r}: its token ids belong to one tier's "
            f"vocabulary, and the cloud tier's is another (or has not said which it is); use {local_model_name!r} "
            "(the local model without routing)",
            "logit_bias",
        )
    if request.logprobs:
        raise InvalidRequestError(
            f"logprobs are not available for the routed model {model!r} (the tiers have different "
            f"vocabularies); use {local_model_name!r} (the local model without routing)",
            "logprobs",
        )


class RoutedChat(NamedTuple):
    """A validated chat request made ready for the cascade: what every front door passes on."""

    messages: list[dict]  # role and content only: tools rendered in the local model's tool format
    params: SamplingParams  # with tools: the format's grammar as params.structured
    answers: ToolAnswers  # reads the answer back as content or tool calls
    tool_choice: str | None = None  # "auto" / "required" when tools are offered (the cascade's tool-call policy)
    # The request's one privacy verdict (prepare_routed), over every text the model sees: the cascade routes
    # by it and a front door that stores the answer (/v1/responses) stores by it, so the two cannot disagree.
    verdict: PrivacyVerdict | None = None


async def prepare_routed(runner: CascadeRunner, request: ChatCompletionRequest, model: str) -> RoutedChat:
    """check_routable, asking the runner whether the tiers share a vocabulary only when logit_bias
    needs it, then prepare, and the privacy verdict on the prepared messages (instructions, history,
    input, tool definitions, calls and outputs, as rendered) and the request's `private` flag: what
    every front door of the cascade runs on a validated request."""
    shared = await runner.shares_vocabulary() if request.logit_bias else False
    check_routable(request, model, runner.local.model_name, shares_vocabulary=shared)
    chat = await prepare(runner.local, request)
    return chat._replace(verdict=runner.privacy_rules.check_messages(chat.messages, private=bool(request.private)))


async def prepare(engine: EngineProtocol, request: ChatCompletionRequest) -> RoutedChat:
    """Messages and sampling parameters of a validated request (InvalidRequestError names the param).
    Tools are rendered in the local model's format for both tiers: the cloud gets the same messages
    and grammar (a tandem cloud engine enforces it whatever its own model's format)."""
    tool_format = tool_format_of(engine)
    message_dicts = request.message_dicts(tool_format)
    # Only a missing max_tokens needs the prompt length (the default is what the context has left).
    missing_budget = request.max_tokens is None and request.max_completion_tokens is None
    num_prompt_tokens = len(await chat_prompt_tokens(engine, message_dicts)) if missing_budget else 0
    tools = request.tool_request()
    return RoutedChat(
        message_dicts,
        request.sampling_params(num_prompt_tokens, engine.max_model_len, tool_format=tool_format),
        ToolAnswers(tool_format, tools),
        None if tools is None else "required" if tools.required else "auto",
    )


async def routed_completion(
    runner: CascadeRunner,
    chat: RoutedChat,
    *,
    model: str,
    private: bool,
    response_id: str,
    created: int,
    key_fingerprint: str | None = None,
    user: str | None = None,
) -> TandemChatCompletion:
    """The whole answer as one chat.completion with the `tandem` field."""
    events = runner.generate(
        chat.messages,
        chat.params,
        model=model,
        private=private,
        request_id=response_id,
        tool_choice=chat.tool_choice,
        streamed=False,
        key_fingerprint=key_fingerprint,
        user=user,
        verdict=chat.verdict,
    )
    result = await collect(events)
    content, calls = chat.answers.read(result.text)
    return TandemChatCompletion(
        id=response_id,
        created=created,
        model=model,
        choices=[ChatChoice.answer(0, content, calls, result.finish_reason, result.stop_reason)],
        usage=usage_of(result.routing, result.tiers),
        tandem=tandem_field(result.routing),
    )


async def routed_stream(
    runner: CascadeRunner,
    chat: RoutedChat,
    *,
    model: str,
    private: bool,
    response_id: str,
    created: int,
    key_fingerprint: str | None = None,
    user: str | None = None,
) -> AsyncIterator[TandemChatCompletionChunk]:
    """The answer as chat.completion.chunk objects.

    The first event is pulled before this returns, so a refused request (bad model, a
    prompt the cloud calls invalid) raises here, while a server can still answer 400."""
    events = runner.generate(
        chat.messages,
        chat.params,
        model=model,
        private=private,
        request_id=response_id,
        tool_choice=chat.tool_choice,
        key_fingerprint=key_fingerprint,
        user=user,
        verdict=chat.verdict,
    )
    try:
        first = await anext(events, None)
    except BaseException:
        await events.aclose()
        raise
    return _chunks(events, first, response_id, created, model, chat.answers)


async def _chunks(
    events: AsyncIterator[CascadeEvent],
    first: CascadeEvent | None,
    response_id: str,
    created: int,
    model: str,
    answers: ToolAnswers,
) -> AsyncIterator[TandemChatCompletionChunk]:
    def chunk(choice: ChatChunkChoice, **extra) -> TandemChatCompletionChunk:
        return TandemChatCompletionChunk(id=response_id, created=created, model=model, choices=[choice], **extra)

    def content_chunk(text: str) -> TandemChatCompletionChunk:
        return chunk(ChatChunkChoice(index=0, delta=DeltaMessage(content=text)))

    tiers: list[str] = []  # the tier of each event released
    try:
        yield chunk(ChatChunkChoice.opening(0))
        event = first
        while True:
            if event is None:
                raise RuntimeError("the cascade stream ended without its final routing event")
            if event.routing is not None:
                routing = event.routing
                rest, calls = answers.finish(0)
                if rest:  # a call cut off part-way: its text is the answer
                    yield content_chunk(rest)
                # The finish always in a chunk of its own, with the usage and the routing (collect() ignores
                # the final event's text too).
                *call_choices, finish = ChatChunkChoice.ending(0, calls, event.finish_reason, event.stop_reason)
                for choice in call_choices:
                    yield chunk(choice)
                yield chunk(finish, usage=usage_of(routing, tiers), tandem=tandem_field(routing))
                return
            tiers.append(event.tier)
            content = answers.feed(0, event.text)
            if content:  # tokens whose text is held back (partial characters, a call being written) need no chunk
                yield content_chunk(content)
            event = await anext(events, None)
    finally:
        await events.aclose()  # a client that stops reading early cancels the generation
