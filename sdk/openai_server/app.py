"""The OpenAI-compatible app over any EngineProtocol: the local runtime and the cloud tier share it."""

from __future__ import annotations

import logging
import time
from typing import Callable

from fastapi import FastAPI

from sdk.protocol.access_gate import AccessGate
from sdk.protocol.api_keys import key_fingerprint
from sdk.protocol.client_limits import DEFAULT_AUTH_BACKOFF_AFTER, DEFAULT_AUTH_BACKOFF_MAX_S, ClientLimits, RequestRateLimiter
from sdk.protocol.engine import EngineProtocol
from sdk.openai_server.access import AccessControl, warn_if_exposed
from sdk.openai_server.budget_metrics import BudgetCollector
from sdk.openai_server.cascade_metrics import CascadeCollector
from sdk.openai_server.errors import install_error_handlers
from sdk.openai_server.limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit
from sdk.openai_server.metrics import EngineStatsCollector, ServerMetrics
from sdk.openai_server.openapi import install_openapi
from sdk.openai_server.routes import mount_routes
from sdk.openai_server.serving import ServerState

logger = logging.getLogger(__name__)


def create_app(
    engine: EngineProtocol,
    *,
    served_model_names: list[str] | None = None,
    api_keys: frozenset[str] = frozenset(),
    rate_limit_per_minute: float | None = None,
    rate_limit_burst: float | None = None,
    max_concurrent_per_key: int | None = None,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    bind_host: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    cascade=None,
    also_ready: Callable[[], bool] | None = None,
    cloud_engine: EngineProtocol | None = None,
    strict_fields: bool = False,
    client_limits: ClientLimits | None = None,
    auth_backoff_after: int | None = DEFAULT_AUTH_BACKOFF_AFTER,
    auth_backoff_max_s: float = DEFAULT_AUTH_BACKOFF_MAX_S,
    traffic=None,
    feedback_per_minute: float | None = None,
    embeddings=None,
    budgets=None,
) -> FastAPI:
    """An app serving `engine` under `served_model_names` (default: the engine's own model name).

    The engine's life cycle stays with the caller: the app only reads `is_ready`, so
    it can answer /health with 503 while the model is still loading.

    Hosted use (all off by default, which is how the local endpoint runs):
    - `api_keys`: when non-empty, every path but /health needs `Authorization: Bearer KEY` (else 401).
    - `rate_limit_per_minute`: requests a minute per key (per client IP without keys), in bursts
      of up to `rate_limit_burst` (default: the per-minute figure); beyond it, 429 + Retry-After.
      `clock` drives the limiter (tests pass a fake one).
    - `max_concurrent_per_key`: requests in flight at once per key (per client IP without keys),
      streams included, until their response ends however it ends; one more is 429 at once.
    - `auth_backoff_after`: with keys, failed keys from one client address before it backs off
      (429 + Retry-After, its key unchecked, for 1 s doubling up to `auth_backoff_max_s`); 0/None: off.
    - `client_limits`: those limits (rate, concurrency, auth backoff) already built (sdk.protocol.client_limits), to share one
      budget per key with another listener of the process (`tandem cloud serve`'s gRPC port);
      then the three settings above stay None.

    Always on (None turns it off): `max_body_bytes`, the largest request body; a larger one
    is 413 before more than that is read (openai_server.limits).
    - `bind_host`: where the caller will listen; without keys beyond loopback, a warning is logged.

    `cascade` (an sdk.cascade.CascadeRunner over this same engine) adds the routed models
    auto, auto:<threshold>, local and cloud to chat completions (openai_server.routed_chat),
    its counters to /metrics, and the cloud breaker's state to /health. `also_ready`: whether the
    embedded cloud engine has loaded; with a cascade /health is 200 once the local engine is in
    and says `"cloud": "loading"` until then (without one, it is a second condition for the 200).
    `cloud_engine`: that embedded engine, whose gauges and counters /metrics adds as
    `tandem:cloud_engine_*` (its KV blocks, running and waiting requests, tokens).
    `strict_fields`: request fields neither OpenAI nor a known extension defines are a 400
    instead of being ignored with a warning (sdk.protocol.request_fields).
    `traffic` (with a cascade): the sdk.traffic.record.TrafficRecord the runner writes to, which
    POST /v1/feedback labels, at most `feedback_per_minute` calls a minute per key (or address).
    `embeddings`: an sdk.embeddings.service.EmbeddingService for POST /v1/embeddings (listed in /v1/models).
    `budgets`: an sdk.budgets.manager.BudgetManager (with a cascade, the runner's own: cascade.budgets);
    GET /v1/budget reports it and /metrics counts what it did.
    """
    if served_model_names is not None and not served_model_names:
        raise ValueError("served_model_names must name at least one model, or be None to use the engine's name")
    if isinstance(api_keys, str):  # frozenset("key") would be a set of its characters
        raise TypeError("api_keys must be a collection of keys, not a single string")
    api_keys = frozenset(api_keys)
    if any(not key.strip() for key in api_keys):
        raise ValueError("api_keys holds an empty key")
    if client_limits is None:
        client_limits = ClientLimits.build(rate_limit_per_minute, rate_limit_burst, max_concurrent_per_key, clock,
                                           auth_backoff_after, auth_backoff_max_s)  # fmt: skip
    elif (rate_limit_per_minute, rate_limit_burst, max_concurrent_per_key) != (None, None, None):
        raise ValueError("pass either client_limits or the rate and concurrency settings, not both")
    gate = AccessGate(api_keys, client_limits)
    if max_body_bytes is not None and max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1 (or None for no limit), got {max_body_bytes}")
    if bind_host is not None:
        warn_if_exposed(bind_host, api_keys)
    if api_keys:
        logger.info("API keys required: %d configured (fingerprints %s)", len(api_keys),
                    ", ".join(sorted(key_fingerprint(key) for key in api_keys)))

    app = FastAPI(title="tandem OpenAI-compatible API", version="1")
    if cascade is not None and cascade.local is not engine:
        raise ValueError("the cascade runner must route over the engine this app serves")
    state = ServerState(engine=engine, served_model_names=served_model_names, metrics=ServerMetrics(engine), cascade=cascade,
                        strict_fields=strict_fields, also_ready=also_ready)
    if cascade is not None:
        state.metrics.registry.register(CascadeCollector(cascade))
        state.traffic = traffic
        if feedback_per_minute is not None:
            state.feedback_limiter = RequestRateLimiter(feedback_per_minute, clock=clock)
    state.embeddings = embeddings
    state.budgets = budgets
    if budgets is not None:
        state.metrics.registry.register(BudgetCollector(budgets))
    app.state.tandem = state
    if cloud_engine is not None:
        attach_cloud_engine(app, cloud_engine)
    app.state.in_flight = client_limits.in_flight  # per-client counts of requests being served (None: no limit)
    app.state.access_gate = gate  # routes that check a secret of their own (/admin/*) ask it too: one backoff per address
    install_error_handlers(app)
    # The last one added runs first: keys, rate and in-flight limits from the headers alone,
    # then the body size, so an unauthenticated client's body is never read.
    if max_body_bytes is not None:
        state.metrics.http_rejections.labels("too_large")  # exported at 0 from the start
        app.add_middleware(BodySizeLimit, max_body_bytes=max_body_bytes, on_reject=state.metrics.count_rejection)
    if gate.active:
        app.add_middleware(AccessControl, gate=gate, metrics=state.metrics)

    install_openapi(app, mount_routes(app, state))  # the handlers read raw bodies: the docs come from the declarations
    return app


def attach_cloud_engine(app: FastAPI, cloud_engine: EngineProtocol) -> None:
    """The embedded cloud engine, once started: its gauges and counters join /metrics as
    `tandem:cloud_engine_*`, and the `cloud` model card reports its sampling defaults."""
    state: ServerState = app.state.tandem
    state.cloud_engine = cloud_engine
    state.metrics.registry.register(EngineStatsCollector(cloud_engine, subsystem="cloud_engine_"))
