"""GET /health (200 once the model is loaded, 503 before and while draining) and GET /metrics."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sdk.openai_server.drain import DRAINING_MESSAGE
from sdk.openai_server.errors import from_exception
from sdk.openai_server.serving import ServerState
from sdk.protocol.engine import EngineNotReadyError

logger = logging.getLogger(__name__)


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    engine, cascade, also_ready = state.engine, state.cascade, state.also_ready
    if engine.draining:  # sdk.openai_server.drain: out of rotation
        return from_exception(EngineNotReadyError(DRAINING_MESSAGE)).response()
    if not engine.is_ready or (cascade is None and also_ready is not None and not also_ready()):
        return from_exception(EngineNotReadyError("the model is still loading; retry shortly")).response()
    shared = _state_db(state) | _kv_cache(request, engine)
    if cascade is None:
        return JSONResponse({"status": "ok"} | shared)
    # The local tier answers every request, so it alone makes the service ready; the cloud's
    # state only says whether escalations can go out ("loading": answered locally meanwhile).
    if also_ready is not None and not also_ready():
        cloud = "loading"
    else:
        cloud = "none" if cascade.cloud is None else cascade.breaker.state.value
    return JSONResponse({"status": "ok", "local": "ready", "cloud": cloud} | shared)


def _state_db(state: ServerState) -> dict:
    """The replicas' state database, when there is one: "ok", "fenced" (reachable again, lease not yet renewed)
    or "unreachable". The replica stays in rotation (200): requests without a budget are served; those with one
    get 503 until it is back. /health takes no key, so why it is away (the database's address, the driver's
    error) is only in the log and in /admin/status."""
    db = state.state_db
    if db is None:
        return {}
    if not db.available:
        return {"state_db": "unreachable"}
    return {"state_db": "fenced" if db.fenced else "ok"}


def _kv_cache(request: Request, engine) -> dict:
    """The serving engine's KV pool: element type, tokens, and tokens per GiB (what a KV precision buys). Only
    where the server has no API keys: /health takes no key, and a hosted API's capacity is its operators' to
    know (/metrics, behind the keys, has it as kv_cache_tokens and kv_cache_bytes).

    Read from the engine's stats once and kept: the pool does not change after loading, and stats() runs beside
    the engine's own thread, so a probe that caught it mid-step must not turn /health into a 500."""
    if request.app.state.access_gate.api_keys:
        return {}
    state: ServerState = request.app.state.tandem
    summary = state.kv_cache_summary
    if summary is None:
        try:
            stats = engine.stats()
        except Exception:  # noqa: BLE001 - a status line, never a reason to fail the probe; asked again next time
            logger.debug("/health: the engine's stats were not readable this time", exc_info=True)
            return {}
        summary = {}
        if stats.kv_cache_bytes_total:
            summary = {
                "kv_cache": {
                    "dtype": stats.kv_cache_dtype,
                    "tokens": stats.kv_cache_tokens_total,
                    "tokens_per_gib": round(stats.kv_tokens_per_gib),
                }
            }
        state.kv_cache_summary = summary
    return summary


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)
