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

from sdk.protocol.api_keys import bearer_token, is_loopback, key_fingerprint, matching_key
from sdk.openai_server.errors import OpenAIError, invalid_api_key, rate_limited
from sdk.openai_server.limits import InFlightLimiter, too_many_in_flight
from sdk.openai_server.metrics import ServerMetrics
from sdk.openai_server.rate_limit import RequestRateLimiter

logger = logging.getLogger(__name__)

# Load balancers probe /health without credentials; everything else (the API, /metrics,
# and any route added later) needs a key once keys are configured.
PUBLIC_PATHS = frozenset({"/health"})
# Prometheus scrapes must not spend a client's request budget (nor be throttled by it).
UNLIMITED_PATHS = PUBLIC_PATHS | {"/metrics"}

class AccessControl:
    """ASGI middleware: 401 without a configured bearer key, 429 over the client's rate limit
    or over its requests in flight (the slot is held until the response has ended, however)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: frozenset[str],
        rate_limiter: RequestRateLimiter | None,
        metrics: ServerMetrics,
        in_flight: InFlightLimiter | None = None,
    ):
        self.app = app
        self.api_keys = api_keys
        self.rate_limiter = rate_limiter
        self.metrics = metrics
        self.in_flight = in_flight
        if in_flight is not None:
            metrics.http_rejections.labels("too_many_in_flight")  # exported at 0 from the start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        error, client = self._refusal(scope)
        if error is None and self.in_flight is not None and scope["path"] not in UNLIMITED_PATHS:
            if not self.in_flight.try_acquire(client):
                self.metrics.count_rejection("too_many_in_flight")
                logger.info("429 for %s: %d requests already in flight", self._who(client), self.in_flight.max_in_flight)
                error = too_many_in_flight(self.in_flight.max_in_flight, per_key=bool(self.api_keys))
            else:
                try:  # returns when the response has ended: finished, failed, cancelled or the client gone
                    await self.app(scope, receive, send)
                finally:
                    self.in_flight.release(client)
                return
        if error is not None:
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _who(self, client: str) -> str:
        return f"key {key_fingerprint(client)}" if self.api_keys else client

    def _refusal(self, scope: Scope) -> tuple[OpenAIError | None, str]:
        """The error to answer with (None to let the request through) and the client's identity."""
        client_host = (scope.get("client") or ("unknown", 0))[0]
        if self.api_keys:
            presented = bearer_token(_header(scope, b"authorization"))
            key = matching_key(presented, self.api_keys)
            if key is None:
                self.metrics.count_rejection("unauthenticated")
                seen = f"a key with fingerprint {key_fingerprint(presented)}" if presented else "no key"
                logger.info("401 for %s %s from %s: %s", scope["method"], scope["path"], client_host, seen)
                return invalid_api_key(presented is not None), f"ip:{client_host}"
            client = key  # buckets live in memory only; logs name the fingerprint
        else:
            # Without keys the client address is the only identity there is. Behind a proxy,
            # run uvicorn with --proxy-headers so this is the real client, not the proxy.
            client = f"ip:{client_host}"
        if self.rate_limiter is None or scope["path"] in UNLIMITED_PATHS:
            return None, client
        wait_s = self.rate_limiter.acquire(client)
        if wait_s <= 0:
            return None, client
        self.metrics.count_rejection("rate_limited")
        logger.info("429 for %s (%.1fs until its next request)", self._who(client), wait_s)
        return rate_limited(wait_s, self.rate_limiter.per_minute), client


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
