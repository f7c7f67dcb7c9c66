"""The OpenAI-compatible app over any EngineProtocol: the local runtime and the cloud tier share it."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response

from sdk.engine_protocol import EngineNotReadyError, EngineProtocol
from sdk.openai_schema import ModelCard, ModelList
from sdk.openai_server.chat import create_chat_completion
from sdk.openai_server.completions import create_completion
from sdk.openai_server.errors import from_exception, install_error_handlers, model_not_found
from sdk.openai_server.metrics import ServerMetrics
from sdk.openai_server.serving import ServerState


def create_app(engine: EngineProtocol, *, served_model_names: list[str] | None = None) -> FastAPI:
    """An app serving `engine` under `served_model_names` (default: the engine's own model name).

    The engine's life cycle stays with the caller: the app only reads `is_ready`, so
    it can answer /health with 503 while the model is still loading.
    """
    if served_model_names is not None and not served_model_names:
        raise ValueError("served_model_names must name at least one model, or be None to use the engine's name")
    app = FastAPI(title="tandem OpenAI-compatible API", version="1")
    state = ServerState(engine=engine, served_model_names=served_model_names, metrics=ServerMetrics(engine))
    app.state.tandem = state
    install_error_handlers(app)

    app.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"], summary="Create a chat completion")
    app.add_api_route("/v1/completions", create_completion, methods=["POST"], summary="Create a completion")

    @app.get("/health", summary="200 once the model is loaded, 503 before")
    async def health() -> Response:
        if not engine.is_ready:
            return from_exception(EngineNotReadyError("the model is still loading; retry shortly")).response()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models", summary="The models this server answers to")
    async def list_models() -> Response:
        return _json(ModelList(data=[_card(state, name) for name in state.model_names]))

    @app.get("/v1/models/{model:path}", summary="One served model")
    async def get_model(model: str) -> Response:
        if model not in state.model_names:
            return model_not_found(model).response()
        return _json(_card(state, model))

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    return app


def _card(state: ServerState, name: str) -> ModelCard:
    return ModelCard(id=name, created=state.created, max_model_len=state.engine.max_model_len or None)


def _json(model) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")
