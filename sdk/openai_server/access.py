"""Who may call the server and how often: bearer API keys, per-client rate limits and
per-client limits on requests in flight.

All are opt-in, so the local endpoint on loopback runs exactly as before. This is a
plain ASGI middleware rather than Starlette's BaseHTTPMiddleware: it only reads the
request's headers and either answers at once or hands the untouched ASGI channels
on, so streaming responses and client-disconnect detection behave as without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from sdk.serving.access_gate import (
    AUTH_BACKOFF,
    RATE_LIMITED,
    TOO_MANY_IN_FLIGHT,
    UNAUTHENTICATED,
    AccessGate,
    Refusal,
)
from sdk.serving.api_keys import bearer_token, is_loopback, key_fingerprint
from sdk.openai_server.errors import OpenAIError, auth_backoff, invalid_api_key, rate_limited
from sdk.openai_server.limits import too_many_in_flight
from sdk.openai_server.metrics import ServerMetrics

logger = logging.getLogger(__name__)

# Load balancers probe /health without credentials; everything else (the API, /metrics,
# and any route added later) needs a key once keys are configured.
# /admin/* checks its own admin key (sdk.openai_server.drain), never an API key, but through
# the same AccessGate: a wrong admin key spends the failed-key backoff of its address like a wrong
# API key, so no door of the process lets an address guess faster than the others.
PUBLIC_PATHS = frozenset({"/health", "/admin/drain", "/admin/resume", "/admin/status"})
# Prometheus scrapes must not spend a client's request budget (nor be throttled by it).
UNLIMITED_PATHS = PUBLIC_PATHS | {"/metrics"}


class AccessControl:
    """ASGI middleware: 401 without a configured bearer key, 429 over the client's rate limit
    or over its requests in flight (the slot is held until the response has ended, however).
    The decisions are the process's AccessGate (sdk.serving.access_gate): a gRPC listener in
    the same process shares its budgets."""

    def __init__(self, app: ASGIApp, *, gate: AccessGate, metrics: ServerMetrics):
        self.app = app
        self.gate = gate
        self.metrics = metrics
        if gate.limits.in_flight is not None:
            metrics.http_rejections.labels(TOO_MANY_IN_FLIGHT)  # exported at 0 from the start
        if gate.api_keys and gate.limits.auth_backoff is not None:
            metrics.http_rejections.labels(AUTH_BACKOFF)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        # Behind a proxy, run uvicorn with --proxy-headers so this is the real client, not the proxy.
        address = (scope.get("client") or ("unknown", 0))[0]
        admission = await self.gate.admit(
            bearer_token(_header(scope, b"authorization")),
            address,
            f"{scope['method']} {scope['path']}",
            limited=scope["path"] not in UNLIMITED_PATHS,
        )
        if admission.refusal is not None:
            self.metrics.count_rejection(admission.refusal.kind)
            await http_error(admission.refusal).response()(scope, receive, send)
            return
        if self.gate.api_keys:  # whose request this is (handlers read request.state.key_fingerprint; never the key)
            scope.setdefault("state", {})["key_fingerprint"] = key_fingerprint(admission.client)
        try:  # returns when the response has ended: finished, failed, cancelled or the client gone
            await self.app(scope, receive, send)
        finally:
            self.gate.release(admission)


def http_error(refusal: Refusal) -> OpenAIError:
    """OpenAI's answer to a refusal."""
    if refusal.kind == UNAUTHENTICATED:
        return invalid_api_key(refusal.key_presented)
    if refusal.kind == AUTH_BACKOFF:
        return auth_backoff(refusal.retry_after_s)
    if refusal.kind == RATE_LIMITED:
        return rate_limited(refusal.retry_after_s, refusal.limit)
    return too_many_in_flight(int(refusal.limit), per_key=refusal.per_key)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def warn_if_exposed(host: str, api_keys: Iterable[str]) -> bool:
    """Log a warning (and return True) when a server without API keys binds beyond loopback."""
    if any(True for _ in api_keys) or is_loopback(host):
        return False
    logger.warning(
        "serving on %r without API keys: anyone who can reach this address can use the model. "
        "Configure API keys (e.g. $TANDEM_API_KEYS) or bind to 127.0.0.1.",
        host,
    )
    return True
