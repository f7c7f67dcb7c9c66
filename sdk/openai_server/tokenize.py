"""POST /tokenize and /detokenize (vLLM's shape, sdk.protocol.openai_schema.tokenize) on both
servers: for the engine's own model (and `local`), the embedded cloud engine's (`cloud`, under
tandem serve), and the embedding model's tokenizer (all-MiniLM-L6-v2). `auto` is refused: the
tiers' vocabularies may differ, so ids mean nothing without naming one."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from sdk.openai_server.errors import from_exception, model_not_found
from sdk.openai_server.serving import ServerState
from sdk.protocol.engine import InvalidRequestError
from sdk.protocol.openai_schema.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from sdk.serving.prompt_tokens import chat_prompt_tokens, text_prompt_tokens


def _target(state: ServerState, model: str | None):
    """The engine (or the embedding service) whose tokenizer `model` names."""
    if model is None or model in state.engine_model_names or (state.cascade is not None and model == "local"):
        return state.engine
    if state.embeddings is not None and model == state.embeddings.model_id:
        return state.embeddings
    if state.cascade is not None and model == "cloud":
        if state.cloud_engine is None:
            raise InvalidRequestError(
                "the cloud tier is a remote server here: ask it (its /tokenize), or name the local model", "model"
            )
        return state.cloud_engine
    if state.cascade is not None and model.partition(":")[0] == "auto":
        raise InvalidRequestError(
            "auto routes between tiers whose vocabularies may differ: name local or cloud", "model"
        )
    raise model_not_found(model)


async def create_tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    try:
        body = TokenizeRequest.model_validate_json(await request.body())
        target = _target(state, body.model)
        if target is state.embeddings:
            if body.messages is not None:
                raise InvalidRequestError(f"{target.model_id} has no chat template; send prompt", "messages")
            tokens = await target.tokenize(body.prompt)
            max_model_len = target.window
        elif body.messages is not None:
            tokens = await chat_prompt_tokens(target, body.messages)
            max_model_len = target.max_model_len
        else:
            tokens = await text_prompt_tokens(target, body.prompt, body.add_special_tokens is not False)
            max_model_len = target.max_model_len
        strs = None
        if body.return_token_strs:
            strs = [await _detokenize(target, [token]) for token in tokens]
    except Exception as exc:
        return from_exception(exc).response()
    return _json(TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=tokens, token_strs=strs))


async def create_detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    try:
        body = DetokenizeRequest.model_validate_json(await request.body())
        text = await _detokenize(_target(state, body.model), body.tokens)
    except Exception as exc:
        return from_exception(exc).response()
    return _json(DetokenizeResponse(prompt=text))


async def _detokenize(target, tokens: list[int]) -> str:
    if hasattr(target, "model_id"):  # the embedding service
        return await target.detokenize(tokens)
    if len(tokens) > 4096:
        return await asyncio.to_thread(target.detokenize, tokens)
    return target.detokenize(tokens)


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(exclude_none=True), media_type="application/json")
