"""GET /v1/models and /v1/models/{model}: one card per name the server answers to, saying what it
is for (llm or embeddings), its route when it is a routed name, and its tier's sampling defaults."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from sdk.openai_server.errors import model_not_found
from sdk.openai_server.serving import ServerState
from sdk.protocol.openai_schema import ModelCard, ModelList


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    cards = await asyncio.to_thread(
        lambda: [card(state, name) for name in state.model_names]
    )  # fingerprints: a vocabulary pass on first read
    if (
        state.embeddings is not None
    ):  # before the engine's own names, which stay last (clients take the last as "the model")
        cards.insert(len(cards) - len(state.engine_model_names), embedding_card(state))
    return _json(ModelList(data=cards))


async def get_model(request: Request, model: str) -> Response:
    state: ServerState = request.app.state.tandem
    if state.embeddings is not None and model == state.embeddings.model_id:
        return _json(embedding_card(state))
    if model not in state.model_names:
        return model_not_found(model).response()
    return _json(await asyncio.to_thread(card, state, model))


def card(state: ServerState, name: str) -> ModelCard:
    engine = state.engine
    if name == "cloud" and state.cascade is not None:
        engine = state.cloud_engine  # the embedded cloud engine; None for a remote cloud (its own defaults)
    elif name.startswith("auto"):
        engine = None  # either tier may answer: each model card says its own
    defaults = engine.sampling_defaults if engine is not None else None
    route = state.routed_mode(name, default_auto=False)
    return ModelCard(
        id=name,
        created=state.created,
        max_model_len=state.engine.max_model_len or None,
        sampling_defaults=defaults.as_dict() if defaults is not None else None,
        vocabulary_fingerprint=(engine.vocabulary_fingerprint if engine is not None else "") or None,
        route=route.value if route is not None else None,
    )


def embedding_card(state: ServerState) -> ModelCard:
    return ModelCard(
        id=state.embeddings.model_id, created=state.created, max_model_len=state.embeddings.window, type="embeddings"
    )


def _json(model) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")
