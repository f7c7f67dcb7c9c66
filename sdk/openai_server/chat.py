"""POST /v1/chat/completions: messages through the model's chat template, answered as OpenAI does."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response

from sdk.protocol.engine import TokenEvent
from sdk.serving.prompt_tokens import chat_prompt_tokens
from sdk.protocol.tool_calls import ToolAnswers
from sdk.protocol.tool_formats import tool_format_of
from sdk.protocol.openai_schema import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
    Usage,
)
from sdk.openai_server.errors import from_exception
from sdk.openai_server.generation import ChoiceState, usage_of
from sdk.openai_server.logprobs import chat_logprobs
from sdk.openai_server.routed_chat import create_routed_chat_completion
from sdk.openai_server.serving import Job, ServerState, choice_requests, ignored_extension, new_id, parse_body, run_job
from sdk.openai_server.streaming import EventStreamResponse, sse_events, sse_for_text


async def create_chat_completion(request: Request) -> Response:
    arrival_time = time.monotonic()
    state: ServerState = request.app.state.tandem
    try:
        body = await parse_body(request, ChatCompletionRequest)
        routed = state.routed_mode(body.model) is not None
        model = (body.model or "auto") if routed else state.resolve_model(body.model)
    except Exception as exc:
        return from_exception(exc).response()
    if routed:
        return await create_routed_chat_completion(request, state, body, model)
    try:
        job, response_id, answers = await chat_job(state, body, model, arrival_time)
    except Exception as exc:
        return from_exception(exc).response()
    created = int(time.time())
    return await run_job(
        request,
        state,
        job,
        stream=bool(body.stream),
        keep_events=bool(body.logprobs),
        stream_body=lambda first, choices: EventStreamResponse(
            _chunks(body, job, response_id, created, first, choices, answers())
        ),
        complete_body=lambda states: chat_response(body, job, response_id, created, states, answers()),
    )


async def chat_job(
    state: ServerState, body: ChatCompletionRequest, model: str, arrival_time: float
) -> tuple[Job, str, Callable[[], ToolAnswers]]:
    """A chat request for the engine itself (no routing): its job, its response id, and a maker of the
    ToolAnswers that reads each choice's text back as content or tool calls. /v1/responses runs the same."""
    tool_format = tool_format_of(state.engine)
    prompt_token_ids = await chat_prompt_tokens(state.engine, body.message_dicts(tool_format))
    max_model_len = state.engine.max_model_len
    response_id = new_id("chatcmpl")
    generation_requests = choice_requests(
        response_id,
        prompt_token_ids,
        body.num_choices,
        lambda i: body.sampling_params(len(prompt_token_ids), max_model_len, i, tool_format),
    )
    job = Job(model, generation_requests, len(prompt_token_ids), arrival_time, user=body.user)
    tools = body.tool_request()
    return job, response_id, lambda: ToolAnswers(tool_format, tools)


def chat_response(
    body: ChatCompletionRequest,
    job: Job,
    response_id: str,
    created: int,
    states: Sequence[ChoiceState],
    answers: ToolAnswers,
) -> ChatCompletionResponse:
    choices = []
    for i, state in enumerate(states):
        content, calls = answers.read(state.text)
        logprobs = chat_logprobs(state.events) if body.logprobs else None
        choices.append(ChatChoice.answer(i, content, calls, state.finish_reason, state.stop_reason, logprobs))
    return ChatCompletionResponse(
        id=response_id,
        created=created,
        model=job.model,
        choices=choices,
        usage=usage_of(job.num_prompt_tokens, states),
        tandem=ignored_extension(body),
    )


def _chunks(
    body: ChatCompletionRequest, job: Job, response_id: str, created: int, first, choices, answers: ToolAnswers
):
    def chunk(choice_list: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=response_id, created=created, model=job.model, choices=choice_list, usage=usage)

    text_events: dict[int, Callable[[str], str]] = {}

    def text_event(index: int) -> Callable[[str], str]:
        if index not in text_events:
            text_events[index] = sse_for_text(
                lambda text: chunk([ChatChunkChoice(index=index, delta=DeltaMessage(content=text))])
            )
        return text_events[index]

    def render_event(index: int, event: TokenEvent, state: ChoiceState) -> list[ChatCompletionChunk | str]:
        content = answers.feed(index, event.text)
        finish_reason, calls = event.finish_reason, None
        if finish_reason is not None:
            rest, calls = answers.finish(index)
            content += rest
        if content and finish_reason is None and not body.logprobs and event.stop_reason is None:
            return [text_event(index)(content)]  # the common case, pre-rendered (the slow path below renders the same)
        chunks = []
        # Nothing to send while text is held back (a partial character, a possible stop string, a call being written).
        if content or body.logprobs or (finish_reason is not None and not calls):
            chunks.append(
                chunk(
                    [
                        ChatChunkChoice(
                            index=index,
                            delta=DeltaMessage(content=content or None),
                            logprobs=chat_logprobs([event]) if body.logprobs else None,
                            finish_reason=None if calls else finish_reason,
                            stop_reason=event.stop_reason,
                        )
                    ]
                )
            )
        if calls:  # the calls, then the finish in a chunk of its own (stop_reason rides on the content chunk above)
            chunks += [chunk([choice]) for choice in ChatChunkChoice.ending(index, calls, finish_reason)]
        return chunks

    prelude = [chunk([ChatChunkChoice.opening(i)]) for i in range(body.num_choices)]
    prelude[0].tandem = ignored_extension(body)  # the ignored request fields, known from the start
    return sse_events(
        first,
        choices,
        body.num_choices,
        render_event,
        prelude=prelude,
        render_usage=(lambda usage: chunk([], usage)) if body.include_usage else None,
        num_prompt_tokens=job.num_prompt_tokens,
    )
