"""Stored responses on the HTTP side (sdk.response_store keeps them): the conversation a
`previous_response_id` continues, keeping an answer once it is whole, and GET / DELETE
/v1/responses/{id}.

A response is kept when the request says `store` (true by default, as OpenAI's), the server keeps
responses (`store_responses`), and the request is not privacy-flagged: its `private` flag, or a
privacy rule of the cascade matching its messages, whatever model it named. A flagged response
is answered as usual, with `store: false`, so naming it later is a 404, as it is for another key's.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sdk.openai_server.errors import OpenAIError, from_exception
from sdk.openai_server.serving import ServerState
from sdk.protocol.openai_schema.response_objects import FunctionCallItem, OutputMessage, ResponseObject
from sdk.protocol.openai_schema.responses_api import ResponseCreateRequest
from sdk.response_store import ResponseStore, StoredResponse

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


def privacy_flagged(state: ServerState, messages: list[dict[str, Any]], private: bool) -> bool:
    """Whether a request must not be stored: its own flag, or a privacy rule matching its messages."""
    if private:
        return True
    return state.privacy_rules is not None and state.privacy_rules.check_messages(messages).private


@dataclass
class Keeper:
    """Keeps one response once it is whole (before the answer naming its id goes out)."""

    store: ResponseStore
    key: str | None
    conversation: list[dict[str, Any]]  # the history and this request's input, as chat messages

    async def keep(self, response: ResponseObject) -> None:
        stored = StoredResponse(
            response.id,
            self.key,
            time.time(),
            self.conversation + [answer_message(response)],
            json.loads(response.model_dump_json()),
        )
        try:
            await self.store.put(stored)
        except Exception:  # the answer still goes out; a later previous_response_id gets the 404
            logger.exception("response %s could not be stored in %s", response.id, self.store.where)


def keeper_for(state: ServerState, body: ResponseCreateRequest, key: str | None, history: list[dict]) -> Keeper | None:
    """The Keeper of a request that is to be stored, else None."""
    if state.responses is None or body.store is False:
        return None
    conversation = body.conversation(history)
    if privacy_flagged(state, conversation, bool(body.private)):
        return None
    return Keeper(state.responses, key, conversation)


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
