"""Who may call the server and how often: bearer API keys and per-client rate limits.

Both are opt-in, so the local endpoint on loopback runs exactly as before. This is a
plain ASGI middleware rather than Starlette's BaseHTTPMiddleware: it only reads the
request's headers and either answers at once or hands the untouched ASGI channels
on, so streaming responses and client-disconnect detection behave as without it.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from sdk.api_keys import bearer_token, key_fingerprint, matching_key
from sdk.openai_server.errors import OpenAIError, invalid_api_key, rate_limited
from sdk.openai_server.metrics import ServerMetrics
from sdk.openai_server.rate_limit import RequestRateLimiter

logger = logging.getLogger(__name__)

# Load balancers probe /health without credentials; everything else (the API, /metrics,
# and any route added later) needs a key once keys are configured.
PUBLIC_PATHS = frozenset({"/health"})
# Prometheus scrapes must not spend a client's request budget (nor be throttled by it).
UNLIMITED_PATHS = PUBLIC_PATHS | {"/metrics"}

LOOPBACK_NAMES = frozenset({"localhost"})


class AccessControl:
    """ASGI middleware: 401 without a configured bearer key, 429 over the client's rate limit."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: frozenset[str],
        rate_limiter: RequestRateLimiter | None,
        metrics: ServerMetrics,
    ):
        self.app = app
        self.api_keys = api_keys
        self.rate_limiter = rate_limiter
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            error = self._refusal(scope)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> OpenAIError | None:
        """The error to answer with, or None to let the request through."""
        client_host = (scope.get("client") or ("unknown", 0))[0]
        if self.api_keys:
            presented = bearer_token(_header(scope, b"authorization"))
            key = matching_key(presented, self.api_keys)
            if key is None:
                self.metrics.count_rejection("unauthenticated")
                seen = f"a key with fingerprint {key_fingerprint(presented)}" if presented else "no key"
                logger.info("401 for %s %s from %s: %s", scope["method"], scope["path"], client_host, seen)
                return invalid_api_key(presented is not None)
            client = key  # buckets live in memory only; logs name the fingerprint
        else:
            # Without keys the client address is the only identity there is. Behind a proxy,
            # run uvicorn with --proxy-headers so this is the real client, not the proxy.
            client = f"ip:{client_host}"
        if self.rate_limiter is None or scope["path"] in UNLIMITED_PATHS:
            return None
        wait_s = self.rate_limiter.acquire(client)
        if wait_s <= 0:
            return None
        self.metrics.count_rejection("rate_limited")
        who = f"key {key_fingerprint(client)}" if self.api_keys else client
        logger.info("429 for %s (%.1fs until its next request)", who, wait_s)
        return rate_limited(wait_s, self.rate_limiter.per_minute)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; anything else (0.0.0.0, '', a LAN name) is reachable from outside."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
