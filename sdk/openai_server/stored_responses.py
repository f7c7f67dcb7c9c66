"""Stored responses on the HTTP side (sdk.response_store keeps them): the conversation a
`previous_response_id` continues, keeping an answer once it is whole, and GET / DELETE
/v1/responses/{id}.

A response is kept when the request says `store` (true by default, as OpenAI's), the server keeps
responses (`store_responses`), and the request is not privacy-flagged: its `private` flag, or a
privacy rule of the cascade matching any text the model sees (instructions, the replayed history,
the input, tool definitions, calls and outputs), whatever model it named. On the routed models that
is the very verdict the cascade routes by (sdk.cascade.openai.prepare_routed), made once per request.
A flagged response is answered as usual, with `store: false`, so naming it later is a 404, as it is
for another key's.

Size: a request whose stored response would be larger than `responses_max_row_mb` before its answer
is even added is refused (400, param `store`) before it runs: the client asked for a conversation it
could continue, and a 400 now beats a 404 on its next turn. An answer that pushes it over, or a store
whose key's older responses free too little room, is answered with `store: false` (not kept).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sdk.cascade.openai import RoutedChat
from sdk.openai_server.errors import OpenAIError, from_exception
from sdk.openai_server.serving import ServerState
from sdk.protocol.openai_schema import ChatCompletionRequest
from sdk.protocol.openai_schema.response_objects import FunctionCallItem, OutputMessage, ResponseObject
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from sdk.protocol.tool_formats import tool_format_of
from sdk.response_store import ResponseStore, StoredResponse
from sdk.response_store.stored import size_of

logger = logging.getLogger(__name__)

STORE_OFF = "this server does not store responses (store_responses = false)"


def not_found(response_id: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(
        404,
        f"No response with id {response_id!r} is stored for this API key (it may have expired, been deleted, been "
        "privacy-flagged, or been stored with store: false).",
        param=param,
        code="response_not_found",
    )


async def previous_conversation(state: ServerState, body: ResponseCreateRequest, key: str | None) -> list[dict]:
    """The chat messages `previous_response_id` names (none without one); a 404 for one not stored for this key."""
    response_id = body.previous_response_id
    if response_id is None:
        return []
    if state.responses is None:
        raise OpenAIError(
            400,
            f"previous_response_id: {STORE_OFF}; send the whole conversation as input items",
            param="previous_response_id",
        )
    stored = await state.responses.get(response_id, key)
    if stored is None:
        raise not_found(response_id, "previous_response_id")
    return stored.conversation


def privacy_flagged(state: ServerState, chat: ChatCompletionRequest, prepared: RoutedChat | None) -> bool:
    """Whether a request must not be stored. A routed one: the verdict its cascade routes by (`prepared`).
    Else its own flag, or a rule of the cascade's matching the messages the engine templates (tools
    rendered in its format), the same texts a routed request's verdict reads."""
    if prepared is not None:
        return prepared.verdict.private
    if chat.private:
        return True
    rules = state.privacy_rules
    return rules is not None and rules.check_messages(chat.message_dicts(tool_format_of(state.engine))).private


@dataclass
class Keeper:
    """Keeps one response once it is whole (before the answer naming its id goes out)."""

    store: ResponseStore
    key: str | None
    conversation: list[dict[str, Any]]  # the history and this request's input, as chat messages

    def refuse_oversized(self, echo: ResponseObject) -> None:
        """A 400 (param `store`) when the stored response would pass the row bound before its answer is added:
        `echo` is the response object with no output yet (the request's settings it repeats)."""
        size = size_of(self.conversation, json.loads(echo.model_dump_json()))
        bound = self.store.settings.max_row_bytes
        if size > bound:
            raise OpenAIError(
                400,
                f"This response would be stored as {size} bytes before its answer, over the {bound} bytes this "
                "server keeps for one response (responses_max_row_mb). Send store: false (and the whole "
                "conversation as input next time), or less (input, instructions, tools, text.format, metadata).",
                param="store",
                code="stored_response_too_large",
            )

    async def keep(self, response: ResponseObject) -> bool:
        """Store it; False when it was not kept (too large, no room left for its key, or the store failed)."""
        stored = StoredResponse(
            response.id,
            self.key,
            time.time(),
            self.conversation + [answer_message(response)],
            json.loads(response.model_dump_json()),
        )
        try:
            kept = await self.store.put(stored)
        except Exception:  # the answer still goes out, saying store: false
            logger.exception("response %s could not be stored in %s", response.id, self.store.where)
            return False
        if not kept:
            logger.warning(
                "response %s not stored: larger than responses_max_row_mb, or its key's older responses free too "
                "little of a full store (responses_max_mb)",
                response.id,
            )
        return kept


def keeper_for(
    state: ServerState, body: ResponseCreateRequest, key: str | None, history: list[dict], flagged: bool
) -> Keeper | None:
    """The Keeper of a request that is to be stored, else None. `flagged`: its one privacy verdict
    (privacy_flagged)."""
    if state.responses is None or body.store is False or flagged:
        return None
    return Keeper(state.responses, key, body.conversation(history))


def answer_message(response: ResponseObject) -> dict[str, Any]:
    """The answer as the assistant's chat message (its text and function calls), for the next turn."""
    text = "".join(part.text for item in response.output if isinstance(item, OutputMessage) for part in item.content)
    calls = [
        {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        for item in response.output
        if isinstance(item, FunctionCallItem)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    elif not text:
        message["content"] = ""
    return message


async def get_response(request: Request) -> Response:
    """GET /v1/responses/{response_id}: the stored response object, as it was answered."""
    state: ServerState = request.app.state.tandem
    response_id = request.path_params["response_id"]
    try:
        stored = await _stored(state, response_id, getattr(request.state, "key_fingerprint", None))
    except Exception as exc:
        return from_exception(exc).response()
    return JSONResponse(stored.response)


async def delete_response(request: Request) -> Response:
    """DELETE /v1/responses/{response_id}: forget it (a later previous_response_id naming it is a 404)."""
    state: ServerState = request.app.state.tandem
    response_id = request.path_params["response_id"]
    try:
        if not await _store(state, response_id).delete(response_id, getattr(request.state, "key_fingerprint", None)):
            raise not_found(response_id)
    except Exception as exc:
        return from_exception(exc).response()
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


def _store(state: ServerState, response_id: str) -> ResponseStore:
    """The server's store; a 404 saying storing is off when it has none."""
    if state.responses is None:
        raise OpenAIError(404, f"{STORE_OFF}: no response {response_id!r}", code="response_not_found")
    return state.responses


async def _stored(state: ServerState, response_id: str, key: str | None) -> StoredResponse:
    stored = await _store(state, response_id).get(response_id, key)
    if stored is None:
        raise not_found(response_id)
    return stored
