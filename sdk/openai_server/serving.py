"""What chat and completions share: the app's state, body parsing, and the run-then-answer flow."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from router.decision import RoutingMode, parse_model_choice
from sdk.protocol.engine import (
    Caller,
    EngineOverloadedError,
    EngineProtocol,
    GenerationRequest,
    InvalidRequestError,
    TokenEvent,
)
from sdk.openai_server.errors import from_exception, model_not_found
from sdk.openai_server.generation import (
    ChoiceState,
    ClientDisconnected,
    cancel_on_disconnect,
    collect_choices,
    merge_choices,
)
from sdk.openai_server.metrics import ServerMetrics
from sdk.openai_server.streaming import EventStreamResponse
from sdk.serving.prompt_tokens import LARGE_BODY_BYTES, off_loop
from sdk.protocol.request_fields import unknown_fields

if TYPE_CHECKING:  # types only: the plain server (tandem cloud serve) never imports the cascade, traffic or embeddings
    from sdk.budgets.manager import BudgetManager
    from sdk.response_store import ResponseStore
    from sdk.cascade.runner import CascadeRunner
    from sdk.embeddings.service import EmbeddingService
    from sdk.serving.client_limits import RequestRateLimiter
    from sdk.traffic.record import TrafficRecord
    from router.privacy import PrivacyRules
    from sdk.state.database import StateDatabase

logger = logging.getLogger(__name__)

RequestModel = TypeVar("RequestModel", bound=BaseModel)
T = TypeVar("T")

BUDGET_WARNING_HEADER = "x-tandem-budget-warning"  # a soft budget reached (sdk.budgets)

# Nginx's code for "client closed request"; nobody reads it, but access logs show why.
CLIENT_CLOSED_STATUS = 499


# The cascade's model names, listed when a server routes: auto, local, cloud.
ROUTED_MODEL_NAMES = tuple(mode.value for mode in RoutingMode)


@dataclass
class ServerState:
    """One app's engine, names and metrics (kept on app.state so handlers stay plain functions).

    With a cascade runner, the routed names (auto, auto:<threshold>, local, cloud) go
    through it, and the engine's own names still reach the local engine directly."""

    engine: EngineProtocol
    served_model_names: list[str] | None
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))
    cascade: CascadeRunner | None = None  # routes auto/local/cloud (tandem serve)
    cloud_engine: EngineProtocol | None = None  # tandem serve's embedded cloud engine, if any
    strict_fields: bool = False  # refuse unknown request fields with a 400 instead of ignoring them
    traffic: TrafficRecord | None = None  # when `tandem serve` keeps one (POST /v1/feedback needs it)
    feedback_limiter: RequestRateLimiter | None = None  # for POST /v1/feedback
    embeddings: EmbeddingService | None = None  # POST /v1/embeddings (tandem serve)
    budgets: BudgetManager | None = None  # of a server without a cascade (tandem cloud serve's hosted API)
    also_ready: Callable[[], bool] | None = None  # an embedded cloud engine's readiness (/health)
    state_db: StateDatabase | None = None  # what the replicas share (/health and /metrics report it)
    responses: ResponseStore | None = None  # stored responses of POST /v1/responses (None: storing off)
    privacy_rules: PrivacyRules | None = None  # the cascade's: a match keeps a response unstored
    kv_cache_summary: dict | None = None  # /health's kv_cache entry, read from the engine's stats once

    @property
    def bills_user(self) -> bool:
        """Whether requests' `user` field is billed (budgets), so it is not an ignored field."""
        return self.budgets is not None or (self.cascade is not None and self.cascade.budgets is not None)

    @property
    def engine_model_names(self) -> list[str]:
        # Read the engine's name late: it may only be final once the model has loaded.
        return list(self.served_model_names or [self.engine.model_name])

    @property
    def model_names(self) -> list[str]:
        routed = list(ROUTED_MODEL_NAMES) if self.cascade is not None else []
        return routed + self.engine_model_names

    def routed_mode(self, requested: str | None, default_auto: bool = True) -> RoutingMode | None:
        """The cascade mode a request asks for, or None when it goes to the engine itself.
        A malformed routed name ("auto:x") raises ModelChoiceError, a 400."""
        if self.cascade is None:
            return None
        if requested is None:
            return RoutingMode.AUTO if default_auto else None
        if requested.strip().lower().partition(":")[0] not in ROUTED_MODEL_NAMES:
            return None
        return parse_model_choice(requested)[0]

    def resolve_model(self, requested: str | None) -> str:
        """The engine model name to echo in responses; 404 for a model this server does not serve."""
        names = self.engine_model_names
        if requested is None:
            return names[0]
        if requested in names:
            return requested
        if self.embeddings is not None and requested == self.embeddings.model_id:
            raise InvalidRequestError(
                f"{requested!r} is an embedding model: POST /v1/embeddings; chat with {', '.join(self.model_names)}",
                "model",
            )
        raise model_not_found(requested)


@dataclass
class Job:
    """A parsed request ready to run: the model to echo and one engine request per choice."""

    model: str
    generation_requests: list[GenerationRequest]
    num_prompt_tokens: int
    arrival_time: float  # time.monotonic() when the request arrived, for TTFT and E2E
    user: str | None = None  # the request's `user` (budgets bill it)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def choice_requests(
    request_id: str, prompt_token_ids: list[int], num_choices: int, params_for
) -> list[GenerationRequest]:
    """One engine request per choice; `params_for(i)` gives choice i its own seed."""
    return [GenerationRequest(f"{request_id}-{i}", list(prompt_token_ids), params_for(i)) for i in range(num_choices)]


async def parse_body(request: Request, model_cls: type[RequestModel]) -> RequestModel:
    """Validate the raw body ourselves: strict types, and malformed JSON as a 400 like any other; the
    models' validators refuse the fields tandem does not implement (request_fields); log the unknown ones."""
    state: ServerState = request.app.state.tandem
    raw = await request.body()
    context = {"strict_fields": state.strict_fields, "uses_user": state.bills_user}
    if len(raw) > LARGE_BODY_BYTES:  # 10,000 messages take ~20 ms to validate: not on the loop
        body = await off_loop(functools.partial(model_cls.model_validate_json, raw, context=context))
    else:
        body = model_cls.model_validate_json(raw, context=context)
    unknown = unknown_fields(body.ignored_fields)
    if unknown:
        logger.warning("the request's fields %s are not known to tandem and were ignored", ", ".join(unknown))
    return body


def ignored_extension(body) -> dict | None:
    """The `tandem` extension of a direct (unrouted) answer: the request fields accepted but ignored."""
    return {"ignored_fields": body.ignored_fields} if body.ignored_fields else None


async def bill_to_caller(request: Request, state: ServerState, job: Job) -> dict[str, str]:
    """Name the caller on each of the job's requests when the engine bills them (the prompt on the
    first choice only, as usage counts it); the soft-budget warning header, if any."""
    if not state.engine.bills_callers:  # sdk.budgets.metered_engine.BudgetedEngine does
        return {}
    key = getattr(request.state, "key_fingerprint", None)
    for index, generation_request in enumerate(job.generation_requests):
        generation_request.caller = Caller(key, job.user, bills_prompt=index == 0)
    warning = await state.engine.soft_warning(Caller(key, job.user))
    return {BUDGET_WARNING_HEADER: warning} if warning else {}


async def await_for_client(
    request: Request, state: ServerState, work: Awaitable[T], events: AsyncGenerator | None = None
) -> T | Response:
    """`work` awaited while the client stays: its result, or the Response to send instead (499 when the
    client left, OpenAI's error JSON for a failure, an overload also counted in /metrics). `events`, the
    generator `work` pulls from, is closed on either, so the request leaves the engine (and its KV) at once.
    Every front door pulls a stream's first event through this before the 200 goes out, so a request the
    engine refuses (context length, overload) is still answered with its proper status."""
    try:
        return await cancel_on_disconnect(request, work)
    except ClientDisconnected:
        outcome = Response(status_code=CLIENT_CLOSED_STATUS)
    except Exception as exc:
        if isinstance(exc, EngineOverloadedError):
            state.metrics.count_rejection("overloaded")
        outcome = from_exception(exc).response()
    if events is not None:
        await events.aclose()
    return outcome


async def run_job(
    request: Request,
    state: ServerState,
    job: Job,
    *,
    stream: bool,
    keep_events: bool,
    stream_body: Callable[[tuple[int, TokenEvent] | None, object], EventStreamResponse],
    complete_body: Callable[[Sequence[ChoiceState]], BaseModel],
) -> Response:
    """Run a job and answer with a stream or a whole body, cancelling it if the client leaves.
    On a server whose engine is billed (sdk.budgets.metered_engine), the requests carry their
    caller, and a soft budget reached adds `x-tandem-budget-warning`."""
    headers = await bill_to_caller(request, state, job)
    choices = merge_choices(state.engine, job.generation_requests, state.metrics, job.arrival_time)

    async def answer() -> Response:
        if stream:
            response = stream_body(await anext(choices, None), choices)
            response.headers.update(headers)
            return response
        states = await collect_choices(choices, len(job.generation_requests), keep_events)
        return Response(complete_body(states).model_dump_json(), media_type="application/json", headers=headers)

    return await await_for_client(request, state, answer(), choices)
