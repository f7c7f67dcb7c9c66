"""Draining one replica of a replicated cloud tier: it takes no new requests and finishes its own.

`tandem cloud serve` serves its engine through a `DrainableEngine`. Draining (SIGTERM, or
`POST /admin/drain` with the admin key) makes `is_ready` false, which both listeners already
report: gRPC health turns NOT_SERVING (clients balancing with health checks stop picking this
replica; sdk.cloud.grpc_client) and HTTP /health answers 503. A request that arrives anyway
(a client that has not seen the health change yet) is refused before it starts, gRPC
UNAVAILABLE / HTTP 503, which a client may retry elsewhere since nothing was generated; the
streams already running go on to their end. On SIGTERM the process then waits for them (up to
its grace period) before it stops. `POST /admin/resume` ends a drain started by the admin call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sdk.openai_server.access import http_error
from sdk.serving.access_gate import AUTH_BACKOFF, AccessGate
from sdk.serving.api_keys import bearer_token
from sdk.protocol.engine import EngineNotReadyError, EngineProtocol, GenerationRequest, TokenEvent
from sdk.serving.engine_wrapper import EngineWrapper

DRAINING_MESSAGE = (
    "this replica is draining (shutting down or taken out of rotation): send the request to another replica"
)


class DrainableEngine(EngineWrapper):
    """`engine`, refusing new generations while draining; counts the ones in flight."""

    draining = False  # set by drain()/resume() (a plain attribute over EngineWrapper's forwarding property)

    def __init__(self, engine: EngineProtocol):
        super().__init__(engine)
        self.draining = False
        self.in_flight = 0
        self.started = 0  # generations this replica took (refused ones not counted)
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def is_ready(self) -> bool:
        return self.engine.is_ready and not self.draining

    def drain(self) -> None:
        self.draining = True

    def resume(self) -> None:
        self.draining = False

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no generation runs (False when `timeout_s` passed first)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self.draining:
            raise EngineNotReadyError(DRAINING_MESSAGE)
        self.in_flight += 1
        self.started += 1
        self._idle.clear()
        try:
            async for event in self.engine.generate(request):
                yield event
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def status(self) -> dict:
        return {"draining": self.draining, "in_flight": self.in_flight, "started": self.started}


def admin_routes(app, engine: DrainableEngine, admin_key: str) -> None:
    """POST /admin/drain, POST /admin/resume and GET /admin/status, for a caller with `admin_key`
    (a separate secret: an API key that may generate must not take a replica out of rotation).

    The admin key is checked by the app's AccessGate (create_app's `app.state.access_gate`), behind
    the same failed-key backoff per client address as the API keys: a wrong admin key is a failed
    try of its address, and an address backing off gets the API's 429 + Retry-After unchecked."""
    gate: AccessGate = app.state.access_gate
    metrics = app.state.tandem.metrics
    admin_keys = frozenset({admin_key})

    async def refused(request: Request) -> Response | None:
        """None for the admin key; else the answer (403, or 429 while the address backs off)."""
        address = request.client.host if request.client is not None else "unknown"  # as AccessControl sees it
        _, refusal = await gate.check_key(
            bearer_token(request.headers.get("authorization")),
            admin_keys,
            address,
            f"{request.method} {request.url.path}",
            name="admin key",
        )
        if refusal is None:
            return None
        metrics.count_rejection(refusal.kind)
        return http_error(refusal).response() if refusal.kind == AUTH_BACKOFF else _forbidden()

    async def drain(request: Request) -> Response:
        if (refusal := await refused(request)) is not None:
            return refusal
        engine.drain()
        return JSONResponse(engine.status())

    async def resume(request: Request) -> Response:
        if (refusal := await refused(request)) is not None:
            return refusal
        engine.resume()
        return JSONResponse(engine.status())

    async def status(request: Request) -> Response:
        if (refusal := await refused(request)) is not None:
            return refusal
        state_db = app.state.tandem.state_db  # its address and last error: for the admin, never in /health
        return JSONResponse(engine.status() | ({"state_db": state_db.status()} if state_db is not None else {}))

    app.add_api_route(
        "/admin/drain", drain, methods=["POST"], summary="Take this replica out of rotation (needs the admin key)"
    )
    app.add_api_route(
        "/admin/resume", resume, methods=["POST"], summary="Put a drained replica back (needs the admin key)"
    )
    app.add_api_route(
        "/admin/status", status, methods=["GET"], summary="Whether this replica drains, and its requests in flight"
    )


def _forbidden() -> Response:
    from sdk.openai_server.errors import OpenAIError

    return OpenAIError(
        403,
        "the admin endpoints need the admin key (--admin-key-file): `Authorization: Bearer <admin key>`",
        type="permission_error",
        code="forbidden",
    ).response()


async def drain_then_stop(engine: DrainableEngine, stop, grace_s: float, logger) -> None:
    """SIGTERM: drain, wait up to `grace_s` for the requests in flight, then `stop()` the listeners."""
    engine.drain()
    logger.info("draining: no new requests; waiting up to %.0f s for %d in flight", grace_s, engine.in_flight)
    if not await engine.wait_idle(grace_s):
        logger.warning("drain grace period over with %d request(s) still in flight: stopping them", engine.in_flight)
    stop()
