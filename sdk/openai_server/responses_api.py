"""POST /v1/responses: OpenAI's Responses API on the chat machinery.

The body (sdk.protocol.openai_schema.responses_api) becomes a chat request, validated as chat's
own (its refusals, sampling parameters, tool grammar, structured output). It runs where a chat
request with that model runs: the cascade for the routed models (auto, auto:<t>, local, cloud),
the engine itself for the model's own name. The answer is rendered as a `response` object
(sdk.protocol.openai_schema.response_objects) or, with `stream: true`, as the API's semantic
events (sdk.openai_server.responses_stream). With `previous_response_id`, the stored conversation it
names comes before the input; the answer is stored once whole (sdk.openai_server.stored_responses).
"""

from __future__ import annotations

import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from sdk.cascade.openai import prepare_routed
from sdk.openai_server.chat import chat_job, chat_response
from sdk.openai_server.errors import from_exception
from sdk.openai_server.responses_stream import ResponseEvents, chunk_events, token_events
from sdk.openai_server.routed_chat import run_routed
from sdk.openai_server.serving import ServerState, parse_body, run_job
from sdk.openai_server.stored_responses import keeper_for, previous_conversation, privacy_flagged
from sdk.openai_server.streaming import EventStreamResponse
from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema import ChatCompletionRequest
from sdk.protocol.openai_schema.response_objects import (
    ResponseObject,
    ResponseUsage,
    finish_status,
    item_id,
    output_items,
)
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from sdk.protocol.request_fields import refuse_unknown_fields, unknown_fields

logger = logging.getLogger(__name__)


async def create_response(request: Request) -> Response:
    arrival_time = time.monotonic()
    state: ServerState = request.app.state.tandem
    key = getattr(request.state, "key_fingerprint", None)
    try:
        body = await parse_body(request, ResponseCreateRequest)
        history = await previous_conversation(state, body, key)
        context = {"strict_fields": state.strict_fields, "uses_user": state.bills_user}
        chat = ChatCompletionRequest.model_validate(body.chat_payload(history), context=context)
        ignored = body.ignored_fields + chat.ignored_fields
        refuse_unknown_fields(body.ignored_fields, state.strict_fields)
        unknown = unknown_fields(ignored)
        if unknown:
            logger.warning("the request's fields %s are not known to tandem and were ignored", ", ".join(unknown))
        routed = state.routed_mode(chat.model) is not None
        model = (chat.model or "auto") if routed else state.resolve_model(chat.model)
        # Routed: prepared here, so that the privacy verdict the cascade routes by is the one storing obeys.
        prepared = await prepare_routed(state.cascade, chat, model) if routed else None
        keeper = keeper_for(state, body, key, history, privacy_flagged(state, chat, prepared))
        response = ResponseEvents(body, item_id("resp"), int(time.time()), model, ignored, keeper)
        if keeper is not None:
            keeper.refuse_oversized(response.object("in_progress", []))
    except Exception as exc:
        return from_exception(exc).response()
    if routed:
        ran = await run_routed(request, state, chat, model, response.id, response.created_at, prepared)
        if isinstance(ran, Response):
            return ran
        result, headers = ran
        if body.stream:
            return EventStreamResponse(chunk_events(response, result), headers=headers)
        whole = await response.keep(as_response(response, result))
        return Response(whole.model_dump_json(), media_type="application/json", headers=headers)
    try:
        job, _, answers = await chat_job(state, chat, model, arrival_time)
    except Exception as exc:
        return from_exception(in_responses_terms(exc)).response()
    answered: list[ResponseObject] = []  # the whole response, kept once run_job has it and before it goes out

    def complete_body(states) -> ResponseObject:
        answered.append(
            as_response(response, chat_response(chat, job, response.id, response.created_at, states, answers()))
        )
        return answered[0]

    sent = await run_job(
        request,
        state,
        job,
        stream=bool(body.stream),
        keep_events=False,
        stream_body=lambda first, choices: EventStreamResponse(
            token_events(response, first, choices, answers(), job.num_prompt_tokens)
        ),
        complete_body=complete_body,
    )
    if answered and sent.status_code == 200:
        kept = await response.keep(answered[0])
        if kept is not answered[0]:  # not kept after all: the body rendered by run_job says store: false instead
            sent.body = kept.model_dump_json().encode()
            sent.headers["content-length"] = str(len(sent.body))
    return sent


def in_responses_terms(exc: Exception) -> Exception:
    """A refusal of the chat request that names chat's `messages` (a model without a chat template), in
    this API's terms: the conversation is `input` here."""
    if type(exc) is InvalidRequestError and exc.param == "messages" and "chat template" in str(exc):
        return InvalidRequestError(
            f"{exc} (this model has no chat template, so /v1/responses cannot turn input into its prompt)", "input"
        )
    return exc


def as_response(response: ResponseEvents, completion) -> ResponseObject:
    """A whole chat completion (one choice) as the response object."""
    choice = completion.choices[0]
    status, incomplete = finish_status(choice.finish_reason)
    message = choice.message
    return response.object(
        status,
        output_items(message.content or "", message.tool_calls, status),
        ResponseUsage.of(completion.usage),
        incomplete,
        completion.tandem,
    )
