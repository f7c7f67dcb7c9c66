"""POST /v1/completions: a raw prompt (text or token ids) continued, in the legacy OpenAI format.

Model `local`, the local model's own name, or none: the local engine answers directly (every field, n > 1 and
logprobs included). The routed models (`auto`, `auto:<threshold>`, `cloud`) go through the cascade
(sdk.openai_server.routed_completions)."""

from __future__ import annotations

import time
from typing import Sequence

from starlette.requests import Request
from starlette.responses import Response

from router.decision import RoutingMode
from sdk.protocol.engine import TokenEvent
from sdk.serving.prompt_tokens import text_prompt_tokens
from sdk.protocol.openai_schema import CompletionChoice, CompletionRequest, CompletionResponse, Usage
from sdk.openai_server.errors import from_exception
from sdk.openai_server.generation import ChoiceState, usage_of
from sdk.openai_server.logprobs import completion_logprobs
from sdk.openai_server.routed_completions import create_routed_completion
from sdk.openai_server.serving import Job, ServerState, choice_requests, ignored_extension, new_id, parse_body, run_job
from sdk.openai_server.streaming import EventStreamResponse, sse_events


async def create_completion(request: Request) -> Response:
    arrival_time = time.monotonic()
    state: ServerState = request.app.state.tandem
    try:
        body = await parse_body(request, CompletionRequest)
        mode = state.routed_mode(body.model, default_auto=False)
        if mode is not None and mode is not RoutingMode.LOCAL:
            return await create_routed_completion(request, state, body, body.model)
        model = body.model if mode is RoutingMode.LOCAL else state.resolve_model(body.model)
        prompt = body.single_prompt()
        # Text gets the model's BOS like any tokenizer call; token ids are the caller's exact prompt.
        prompt_token_ids = await text_prompt_tokens(state.engine, prompt) if isinstance(prompt, str) else prompt
        response_id = new_id("cmpl")
        generation_requests = choice_requests(response_id, prompt_token_ids, body.num_choices, body.sampling_params)
    except Exception as exc:
        return from_exception(exc).response()
    job = Job(model, generation_requests, len(prompt_token_ids), arrival_time, user=body.user)
    created = int(time.time())
    return await run_job(
        request,
        state,
        job,
        stream=bool(body.stream),
        keep_events=body.logprobs is not None,
        stream_body=lambda first, choices: EventStreamResponse(
            _chunks(body, job, response_id, created, first, choices)
        ),
        complete_body=lambda states: _response(body, job, response_id, created, states),
    )


def _response(
    body: CompletionRequest, job: Job, response_id: str, created: int, states: Sequence[ChoiceState]
) -> CompletionResponse:
    choices = [
        CompletionChoice(
            index=i,
            text=state.text,
            logprobs=completion_logprobs(state.events) if body.logprobs is not None else None,
            finish_reason=state.finish_reason,
            stop_reason=state.stop_reason,
        )
        for i, state in enumerate(states)
    ]
    return CompletionResponse(
        id=response_id,
        created=created,
        model=job.model,
        choices=choices,
        usage=usage_of(job.num_prompt_tokens, states),
        tandem=ignored_extension(body),
    )


def _chunks(body: CompletionRequest, job: Job, response_id: str, created: int, first, choices):
    want_logprobs = body.logprobs is not None
    text_offsets = [0] * body.num_choices  # where each choice's next token starts, for text_offset

    extension = [ignored_extension(body)]  # rides on the first chunk sent

    def chunk(choice_list: list[CompletionChoice], usage: Usage | None = None) -> CompletionResponse:
        tandem, extension[0] = extension[0], None
        return CompletionResponse(
            id=response_id, created=created, model=job.model, choices=choice_list, usage=usage, tandem=tandem
        )

    def render_event(index: int, event: TokenEvent, state: ChoiceState) -> CompletionResponse | None:
        if not event.text and event.finish_reason is None and not want_logprobs:
            return None  # text held back (a partial character or a possible stop string)
        logprobs = None
        if want_logprobs:
            logprobs = completion_logprobs([event], text_offsets[index])
            text_offsets[index] += sum(len(t) for t in logprobs.tokens)
        return chunk(
            [
                CompletionChoice(
                    index=index,
                    text=event.text,
                    logprobs=logprobs,
                    finish_reason=event.finish_reason,
                    stop_reason=event.stop_reason,
                )
            ]
        )

    return sse_events(
        first,
        choices,
        body.num_choices,
        render_event,
        render_usage=(lambda usage: chunk([], usage)) if body.include_usage else None,
        num_prompt_tokens=job.num_prompt_tokens,
    )
