"""POST /v1/feedback: labels for the router from the apps that got the answers (sdk.traffic).

404 for an id the traffic record never saw (or with the record off), 403 for a response
another API key received, 429 past `feedback_per_minute` for the caller; a privacy-flagged
response is answered `recorded: false` and nothing is stored."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from sdk.openai_server.errors import OpenAIError, from_exception, rate_limited
from sdk.openai_server.serving import ServerState
from sdk.protocol.openai_schema.feedback import FeedbackRequest, FeedbackResponse
from sdk.traffic.record import FeedbackError

_CODES = {403: "permission_denied", 404: "response_not_found"}


async def create_feedback(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    try:
        body = FeedbackRequest.model_validate_json(await request.body())
        record = state.traffic
        if record is None:
            raise OpenAIError(
                404,
                "feedback needs the traffic record: start tandem serve with [traffic] record = true "
                "(TANDEM_TRAFFIC_RECORD=1)",
                code="traffic_record_off",
            )
        key = getattr(request.state, "key_fingerprint", None)
        who = key or f"ip:{(request.client.host if request.client else 'unknown')}"
        wait_s = state.feedback_limiter.take(who) if state.feedback_limiter is not None else 0.0
        if wait_s > 0:
            raise rate_limited(wait_s, state.feedback_limiter.per_minute)
        try:
            outcome = await asyncio.to_thread(
                record.feedback, body.id, key, body.value, "thumbs" if body.thumbs else "score"
            )
        except FeedbackError as exc:
            raise OpenAIError(exc.status, str(exc), param="id", code=_CODES.get(exc.status)) from exc
    except Exception as exc:
        return from_exception(exc).response()
    answer = FeedbackResponse(id=body.id, score=body.value, **outcome)
    return Response(answer.model_dump_json(exclude_none=True), media_type="application/json")
