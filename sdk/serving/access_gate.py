"""Who may call a serving process and how much, decided once for all its listeners.

The HTTP servers (sdk.openai_server.access) and the gRPC service (sdk.serving.grpc.auth)
ask one `AccessGate` per process, so a key's budget is one budget whichever door its
requests come through. Per request, in order: whether the caller's address is backing off
after failed keys (then it is refused whatever its key, and a wrong one is not counted), the
API key (when keys are configured), the rate limit, the limit on requests in flight
(sdk.serving.client_limits; a right key's three limits are one `ClientLimits.admit`, one round
trip where replicas share them).
A caller is identified by its key, or by its address (`ip:<host>`) when the process has
no keys. Each listener turns a `Refusal` into its own protocol's answer (HTTP 401/429,
gRPC UNAUTHENTICATED/RESOURCE_EXHAUSTED) and releases an admitted request's slot when
its response has ended, however it ended. The admin key of /admin/* (sdk.openai_server.drain)
is checked by the same gate (`check_key`): one failed-key backoff per address for every secret.

Keys never reach the log: refusals log the key's fingerprint. Refusal lines are deduplicated
per client and kind: the first is logged, repeats within LOG_EVERY_S are counted and the count
rides on the next line logged for them, so a guessing loop cannot flood the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sdk.serving.api_keys import key_fingerprint, loggable_id, matching_key
from sdk.serving.client_limits import ClientLimits

logger = logging.getLogger(__name__)

LOG_EVERY_S = 60.0  # at most one refusal line per client and kind this often
MAX_LOG_KEYS = 10_000  # (client, kind) pairs remembered for deduplication

UNAUTHENTICATED = "unauthenticated"
AUTH_BACKOFF = "auth_backoff"
RATE_LIMITED = "rate_limited"
TOO_MANY_IN_FLIGHT = "too_many_in_flight"


@dataclass(frozen=True)
class Refusal:
    """Why a request is not served."""

    kind: str  # UNAUTHENTICATED, AUTH_BACKOFF, RATE_LIMITED or TOO_MANY_IN_FLIGHT
    retry_after_s: float = 0.0  # seconds until the client may try again (all but UNAUTHENTICATED)
    key_presented: bool = False  # UNAUTHENTICATED: a wrong key (True) or none at all
    limit: float = 0.0  # the limit hit: requests a minute, or requests in flight
    per_key: bool = True  # limits: counted per API key (False: per client address)


@dataclass(frozen=True)
class Admission:
    """The gate's answer: a refusal, or the client whose in-flight slot the request holds."""

    client: str  # the identity budgets are kept for: the key itself, or "ip:<host>"
    refusal: Refusal | None = None
    holds_slot: bool = False  # release() it when the response has ended


class DedupLog:
    """Logs the first line per key, then at most one per `every_s`, carrying the count it skipped."""

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self.clock = clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (last logged, skipped since)

    def info(self, key: tuple[str, str], message: str, *args) -> None:
        now = self.clock()
        last, skipped = self._seen.get(key, (None, 0))
        if last is not None and now - last < self.every_s:
            self._seen[key] = (last, skipped + 1)
            return
        if len(self._seen) >= MAX_LOG_KEYS and key not in self._seen:
            self._seen.clear()  # a scan of addresses: forget counts rather than grow
        self._seen[key] = (now, 0)
        if skipped:
            message, args = message + " (%d more like it not logged since the last line)", (*args, skipped)
        logger.info(message, *args)


class AccessGate:
    """API keys plus ClientLimits for one serving process (module docstring)."""

    def __init__(self, api_keys: Iterable[str] = frozenset(), limits: ClientLimits | None = None):
        self.api_keys = frozenset(api_keys)
        self.limits = limits or ClientLimits()
        self.log = DedupLog(clock=self.limits.clock)

    @property
    def active(self) -> bool:
        """Whether the gate can refuse anything (else listeners may skip it)."""
        return bool(self.api_keys) or self.limits.active

    def who(self, client: str) -> str:
        """A loggable name for a client: its key's id (the logged prefix), never the key."""
        return f"key {loggable_id(key_fingerprint(client))}" if self.api_keys else client

    async def admit(self, presented_key: str | None, address: str, what: str, *, limited: bool = True) -> Admission:
        """Decide on one request from `address` (the peer's host) presenting `presented_key`.

        `what` names the call in log lines ("POST /v1/chat/completions", a gRPC method).
        `limited=False` checks the key only (paths that must not spend a budget: /metrics)."""
        client = f"ip:{address}"
        if self.api_keys:
            # A wrong key (or none) takes check_key's path: the backoff, then the failure counted. A right one
            # is refused all the same while its address backs off, asked below with the other limits.
            key = matching_key(presented_key, self.api_keys)
            if key is None or not limited:
                key, refusal = await self.check_key(presented_key, self.api_keys, address, what)
                if refusal is not None:
                    return Admission(client, refusal)
            client = key
            logger.debug("%s by key %s", what, loggable_id(key_fingerprint(key)))
        if not limited:
            return Admission(client)
        per_key = bool(self.api_keys)
        decision = await self.limits.admit(address if self.api_keys else None, client)
        if decision.backoff_wait_s > 0:
            return Admission(client, self._backing_off(address, what, decision.backoff_wait_s))
        if decision.rate_wait_s > 0:
            rate = self.limits.rate
            self.log.info(
                (client, RATE_LIMITED),
                "%s refused for %s: rate limit (%.1fs until its next request)",
                what,
                self.who(client),
                decision.rate_wait_s,
            )
            return Admission(
                client,
                Refusal(RATE_LIMITED, retry_after_s=decision.rate_wait_s, limit=rate.per_minute, per_key=per_key),
            )
        if decision.entered is None:
            return Admission(client)
        if not decision.entered:
            in_flight = self.limits.in_flight
            self.log.info(
                (client, TOO_MANY_IN_FLIGHT),
                "%s refused for %s: %d requests already in flight",
                what,
                self.who(client),
                in_flight.max_in_flight,
            )
            return Admission(
                client, Refusal(TOO_MANY_IN_FLIGHT, retry_after_s=1.0, limit=in_flight.max_in_flight, per_key=per_key)
            )
        return Admission(client, holds_slot=True)

    def _backing_off(self, address: str, what: str, wait_s: float) -> Refusal:
        self.log.info(
            (address, AUTH_BACKOFF),
            "%s from %s refused unchecked: backing off after failed keys (%.1fs left)",
            what,
            address,
            wait_s,
        )
        return Refusal(AUTH_BACKOFF, retry_after_s=wait_s, per_key=False)

    async def check_key(
        self, presented_key: str | None, keys: frozenset[str], address: str, what: str, name: str = "API key"
    ) -> tuple[str | None, Refusal | None]:
        """The key of `keys` that `presented_key` is, or why not: AUTH_BACKOFF while `address` backs
        off (the key is not even compared), else UNAUTHENTICATED, which counts as a failed try of
        `address`. Every secret a listener checks comes through here (the API keys in `admit`, the
        admin key of /admin/*), so a guess at any of them spends the one backoff of its address."""
        backoff = self.limits.auth_backoff
        if backoff is not None and (wait_s := await backoff.wait_s(address)) > 0:
            return None, self._backing_off(address, what, wait_s)
        key = matching_key(presented_key, keys)
        if key is not None:
            return key, None
        waits = await backoff.failed(address) if backoff is not None else 0.0
        seen = f"unknown {name} {loggable_id(key_fingerprint(presented_key))}" if presented_key else f"no {name}"
        then = f"; it now waits {waits:g}s before its next key is checked" if waits else ""
        self.log.info((address, UNAUTHENTICATED), "%s from %s refused: %s%s", what, address, seen, then)
        return None, Refusal(UNAUTHENTICATED, key_presented=presented_key is not None)

    def release(self, admission: Admission) -> None:
        """End an admitted request: its in-flight slot goes back."""
        if admission.holds_slot and self.limits.in_flight is not None:
            self.limits.in_flight.release(admission.client)
