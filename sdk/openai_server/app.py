"""The OpenAI-compatible app over any EngineProtocol: the local runtime and the cloud tier share it."""

from __future__ import annotations

import logging
import time
from typing import Callable

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response

from sdk.api_keys import key_fingerprint
from sdk.engine_protocol import EngineNotReadyError, EngineProtocol
from sdk.openai_schema import ModelCard, ModelList
from sdk.openai_server.access import AccessControl, warn_if_exposed
from sdk.openai_server.cascade_metrics import CascadeCollector
from sdk.openai_server.chat import create_chat_completion
from sdk.openai_server.completions import create_completion
from sdk.openai_server.errors import from_exception, install_error_handlers, model_not_found
from sdk.openai_server.metrics import ServerMetrics
from sdk.openai_server.rate_limit import RequestRateLimiter
from sdk.openai_server.serving import ServerState

logger = logging.getLogger(__name__)


def create_app(
    engine: EngineProtocol,
    *,
    served_model_names: list[str] | None = None,
    api_keys: frozenset[str] = frozenset(),
    rate_limit_per_minute: float | None = None,
    rate_limit_burst: float | None = None,
    bind_host: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    cascade=None,
    also_ready: Callable[[], bool] | None = None,
) -> FastAPI:
    """An app serving `engine` under `served_model_names` (default: the engine's own model name).

    The engine's life cycle stays with the caller: the app only reads `is_ready`, so
    it can answer /health with 503 while the model is still loading.

    Hosted use (all off by default, which is how the local endpoint runs):
    - `api_keys`: when non-empty, every path but /health needs `Authorization: Bearer KEY` (else 401).
    - `rate_limit_per_minute`: requests a minute per key (per client IP without keys), in bursts
      of up to `rate_limit_burst` (default: the per-minute figure); beyond it, 429 + Retry-After.
      `clock` drives the limiter (tests pass a fake one).
    - `bind_host`: where the caller will listen; without keys beyond loopback, a warning is logged.

    `cascade` (an sdk.cascade.CascadeRunner over this same engine) adds the routed models
    auto, auto:<threshold>, local and cloud to chat completions (openai_server.routed_chat),
    its counters to /metrics, and the cloud breaker's state to /health. `also_ready`: a
    second condition for /health's 200 (tandem serve: the embedded cloud engine has loaded).
    """
    if served_model_names is not None and not served_model_names:
        raise ValueError("served_model_names must name at least one model, or be None to use the engine's name")
    if isinstance(api_keys, str):  # frozenset("key") would be a set of its characters
        raise TypeError("api_keys must be a collection of keys, not a single string")
    api_keys = frozenset(api_keys)
    if any(not key.strip() for key in api_keys):
        raise ValueError("api_keys holds an empty key")
    if rate_limit_per_minute is None and rate_limit_burst is not None:
        raise ValueError("rate_limit_burst needs rate_limit_per_minute")
    rate_limiter = None if rate_limit_per_minute is None else RequestRateLimiter(rate_limit_per_minute, rate_limit_burst, clock)
    if bind_host is not None:
        warn_if_exposed(bind_host, api_keys)
    if api_keys:
        logger.info("API keys required: %d configured (fingerprints %s)", len(api_keys),
                    ", ".join(sorted(key_fingerprint(key) for key in api_keys)))

    app = FastAPI(title="tandem OpenAI-compatible API", version="1")
    if cascade is not None and cascade.local is not engine:
        raise ValueError("the cascade runner must route over the engine this app serves")
    state = ServerState(engine=engine, served_model_names=served_model_names, metrics=ServerMetrics(engine), cascade=cascade)
    if cascade is not None:
        state.metrics.registry.register(CascadeCollector(cascade))
    app.state.tandem = state
    install_error_handlers(app)
    if api_keys or rate_limiter is not None:
        app.add_middleware(AccessControl, api_keys=api_keys, rate_limiter=rate_limiter, metrics=state.metrics)

    app.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"], summary="Create a chat completion")
    app.add_api_route("/v1/completions", create_completion, methods=["POST"], summary="Create a completion")

    @app.get("/health", summary="200 once the model is loaded, 503 before")
    async def health() -> Response:
        if not engine.is_ready or (also_ready is not None and not also_ready()):
            return from_exception(EngineNotReadyError("the model is still loading; retry shortly")).response()
        if cascade is None:
            return JSONResponse({"status": "ok"})
        # The local tier answers every request; the cloud's state only says whether escalations can go out.
        cloud = "none" if cascade.cloud is None else cascade.breaker.state.value
        return JSONResponse({"status": "ok", "local": "ready", "cloud": cloud})

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
