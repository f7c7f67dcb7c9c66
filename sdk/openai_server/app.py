"""The OpenAI-compatible app over any EngineProtocol: the local runtime and the cloud tier share it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from fastapi import FastAPI

from sdk.serving.access_gate import AccessGate
from sdk.serving.api_keys import LOGGED_DIGITS, key_fingerprint, loggable_id
from sdk.serving.client_limits import ClientLimits, RequestRateLimiter
from sdk.protocol.engine import EngineProtocol
from sdk.openai_server.access import AccessControl, warn_if_exposed
from sdk.openai_server.app_config import AppConfig
from sdk.openai_server.budget_metrics import BudgetCollector, StateDatabaseCollector
from sdk.openai_server.cascade_metrics import CascadeCollector
from sdk.openai_server.errors import install_error_handlers
from sdk.openai_server.limits import BodySizeLimit
from sdk.openai_server.metrics import EngineStatsCollector, ServerMetrics
from sdk.openai_server.openapi import install_openapi
from sdk.openai_server.routes import mount_routes
from sdk.openai_server.serving import ServerState
from sdk.openai_server.traffic_metrics import TrafficCollector

if TYPE_CHECKING:
    from sdk.budgets.manager import BudgetManager
    from sdk.cascade.runner import CascadeRunner
    from sdk.embeddings.service import EmbeddingService
    from sdk.response_store import ResponseStore
    from sdk.state.database import StateDatabase
    from sdk.traffic.learning import Learning

logger = logging.getLogger(__name__)


@dataclass
class AppServices:
    """What an app serves with, each made by its caller (the serve commands build them from their config):

    - `engine`: the EngineProtocol the app serves (its own model name reaches it directly). Its life cycle
      stays with the caller: the app only reads `is_ready`, so /health is 503 while it loads.
    - `cascade` (an sdk.cascade.CascadeRunner over this same engine) adds the routed models auto,
      auto:<threshold>, local and cloud to chat completions (openai_server.routed_chat), its counters to
      /metrics, and the cloud breaker's state to /health.
    - `also_ready`: whether the embedded cloud engine has loaded; with a cascade /health is 200 once the local
      engine is in and says `"cloud": "loading"` until then (without one, it is a second condition for the 200).
    - `cloud_engine`: that embedded engine, whose gauges and counters /metrics adds as `tandem:cloud_engine_*`.
    - `client_limits`: the limits already built (AppConfig.client_limits) to share one budget per key with another
      listener of the process (`tandem cloud serve`'s gRPC port); None: the app builds its own from the config,
      driven by `clock` (tests pass a fake one).
    - `learning` (with a cascade): the sdk.traffic.learning parts: its record takes POST /v1/feedback's labels (at
      most `config.feedback_per_minute` calls a minute per key); /metrics counts what they did.
    - `embeddings`: an sdk.embeddings.service.EmbeddingService for POST /v1/embeddings (listed in /v1/models).
    - `budgets`: an sdk.budgets.manager.BudgetManager (with a cascade, the runner's own); GET /v1/budget reports
      it and /metrics counts what it did.
    - `state_db`: the sdk.state.database.StateDatabase the replicas share (the budgets' ledger and the client
      limits are kept there when it is given); /health and /metrics say whether it is reachable.
    - `response_store`: where POST /v1/responses keeps what it answers (sdk.response_store), which
      previous_response_id and GET/DELETE /v1/responses/{id} read; None: responses are not stored.
    """

    engine: EngineProtocol
    cascade: CascadeRunner | None = None
    also_ready: Callable[[], bool] | None = None
    cloud_engine: EngineProtocol | None = None
    client_limits: ClientLimits | None = None
    learning: Learning | None = None
    embeddings: EmbeddingService | None = None
    budgets: BudgetManager | None = None
    state_db: StateDatabase | None = None
    response_store: ResponseStore | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.cascade is not None and self.cascade.local is not self.engine:
            raise ValueError("the cascade runner must route over the engine this app serves")


def create_app(config: AppConfig, services: AppServices) -> FastAPI:
    """The OpenAI-compatible app configured by `config` (sdk.openai_server.app_config.AppConfig) over
    `services`: its state, its metrics, its middleware (keys and limits, then the body's size) and its routes."""
    gate = AccessGate(config.api_keys, services.client_limits or config.client_limits(services.clock))
    if config.bind_host is not None:
        warn_if_exposed(config.bind_host, config.api_keys)
    if config.api_keys:
        logger.info(
            "API keys required: %d configured (ids, first %d digits: %s...)",
            len(config.api_keys),
            LOGGED_DIGITS,
            ", ".join(sorted(loggable_id(key_fingerprint(key)) for key in config.api_keys)),
        )
    state = server_state(config, services)
    app = FastAPI(title="tandem OpenAI-compatible API", version="1")
    app.state.tandem = state
    app.state.in_flight = gate.limits.in_flight  # per-client counts of requests being served (None: no limit)
    app.state.access_gate = gate  # routes that check a secret of their own (/admin/*) ask it too: one backoff
    if services.cloud_engine is not None:
        attach_cloud_engine(app, services.cloud_engine)
    install_error_handlers(app)
    # The last one added runs first: keys, rate and in-flight limits from the headers alone,
    # then the body size, so an unauthenticated client's body is never read.
    if config.max_body_bytes is not None:
        state.metrics.http_rejections.labels("too_large")  # exported at 0 from the start
        app.add_middleware(BodySizeLimit, max_body_bytes=config.max_body_bytes, on_reject=state.metrics.count_rejection)
    if gate.active:
        app.add_middleware(AccessControl, gate=gate, metrics=state.metrics)
    install_openapi(app, mount_routes(app, state))  # the handlers read raw bodies: the docs come from the declarations
    return app


def server_state(config: AppConfig, services: AppServices) -> ServerState:
    """What the handlers read (app.state.tandem), with /metrics' collectors for each part that is there."""
    cascade, learning = services.cascade, services.learning
    names = list(config.served_model_names) if config.served_model_names is not None else None
    feedback_limiter = (
        RequestRateLimiter(config.feedback_per_minute, clock=services.clock)
        if cascade is not None and config.feedback_per_minute is not None
        else None
    )
    state = ServerState(
        engine=services.engine,
        served_model_names=names,
        metrics=ServerMetrics(services.engine),
        cascade=cascade,
        strict_fields=config.strict_fields,
        traffic=learning.record if cascade is not None and learning is not None else None,
        feedback_limiter=feedback_limiter,
        embeddings=services.embeddings,
        budgets=services.budgets,
        also_ready=services.also_ready,
        state_db=services.state_db,
        responses=services.response_store,
        privacy_rules=cascade.privacy_rules if cascade is not None else None,
    )
    registry = state.metrics.registry
    if cascade is not None:
        registry.register(CascadeCollector(cascade))
    if state.traffic is not None:
        registry.register(TrafficCollector(learning))
    if services.budgets is not None:
        registry.register(BudgetCollector(services.budgets))
    if services.state_db is not None:
        registry.register(StateDatabaseCollector(services.state_db))
    return state


def attach_cloud_engine(app: FastAPI, cloud_engine: EngineProtocol) -> None:
    """The embedded cloud engine, once started: its gauges and counters join /metrics as
    `tandem:cloud_engine_*`, and the `cloud` model card reports its sampling defaults."""
    state: ServerState = app.state.tandem
    state.cloud_engine = cloud_engine
    state.metrics.registry.register(EngineStatsCollector(cloud_engine, subsystem="cloud_engine_"))
