"""POST /v1/responses: OpenAI's Responses API on the chat machinery.

The body (sdk.protocol.openai_schema.responses_api) becomes a chat request, validated as chat's
own (its refusals, sampling parameters, tool grammar, structured output). It runs where a chat
request with that model runs: the cascade for the routed models (auto, auto:<t>, local, cloud),
the engine itself for the model's own name. The answer is rendered as a `response` object
(sdk.protocol.openai_schema.response_objects) or, with `stream: true`, as the API's semantic
events (sdk.openai_server.responses_stream).
"""

from __future__ import annotations

import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from sdk.openai_server.chat import chat_job, chat_response
from sdk.openai_server.errors import from_exception
from sdk.openai_server.responses_stream import ResponseEvents, chunk_events, token_events
from sdk.openai_server.routed_chat import run_routed
from sdk.openai_server.serving import ServerState, parse_body, run_job
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
from sdk.protocol.request_fields import unknown_fields

logger = logging.getLogger(__name__)


async def create_response(request: Request) -> Response:
    arrival_time = time.monotonic()
    state: ServerState = request.app.state.tandem
    try:
        body = await parse_body(request, ResponseCreateRequest)
        if body.previous_response_id is not None:
            raise InvalidRequestError(
                "previous_response_id: this server does not keep responses yet; send the whole conversation as "
                "input items",
                "previous_response_id",
            )
        context = {"strict_fields": state.strict_fields, "uses_user": state.bills_user}
        chat = ChatCompletionRequest.model_validate(body.chat_payload(), context=context)
        unknown = unknown_fields(chat.ignored_fields)
        if unknown:
            logger.warning("the request's fields %s are not known to tandem and were ignored", ", ".join(unknown))
        routed = state.routed_mode(chat.model) is not None
        model = (chat.model or "auto") if routed else state.resolve_model(chat.model)
    except Exception as exc:
        return from_exception(exc).response()
    response = ResponseEvents(body, item_id("resp"), int(time.time()), model, chat.ignored_fields)
    if routed:
        ran = await run_routed(request, state, chat, model, response.id, response.created_at)
        if isinstance(ran, Response):
            return ran
        result, headers = ran
        if body.stream:
            return EventStreamResponse(chunk_events(response, result), headers=headers)
        return Response(as_response(response, result).model_dump_json(), media_type="application/json", headers=headers)
    try:
        job, _, answers = await chat_job(state, chat, model, arrival_time)
    except Exception as exc:
        return from_exception(exc).response()
    return await run_job(
        request,
        state,
        job,
        stream=bool(body.stream),
        keep_events=False,
        stream_body=lambda first, choices: EventStreamResponse(
            token_events(response, first, choices, answers(), job.num_prompt_tokens)
        ),
        complete_body=lambda states: as_response(
            response, chat_response(chat, job, response.id, response.created_at, states, answers())
        ),
    )


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
