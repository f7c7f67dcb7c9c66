"""What an OpenAI-compatible app is configured with: one object, built by sdk.settings for both servers.

sdk.settings.server_sections.app_config builds it from a listener's keys: ServeConfig's from [server]
(`tandem serve`), CloudServeConfig's from [cloud_server] (`tandem cloud serve`); tests and embedders
build it directly. Only settings live here: the objects an app serves with (engine, cascade, budgets, ...)
are its AppServices (sdk.openai_server.app).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Callable

from sdk.serving.client_limits import DEFAULT_AUTH_BACKOFF_AFTER, DEFAULT_AUTH_BACKOFF_MAX_S, ClientLimits
from sdk.openai_server.limits import DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class AppConfig:
    """Hosted use is all off by default, which is how the local endpoint runs.

    - `served_model_names`: the names /v1/models lists and requests may use (None: the engine's own).
    - `api_keys`: when non-empty, every path but /health needs `Authorization: Bearer KEY` (else 401).
    - `rate_limit_per_minute`: requests a minute per key (per client IP without keys), in bursts of
      up to `rate_limit_burst` (default: the per-minute figure); beyond it, 429 + Retry-After.
    - `max_concurrent_per_key`: requests in flight at once per key (per client IP without keys),
      streams included, until their response ends however it ends; one more is 429 at once.
    - `auth_backoff_after`: with keys, failed keys from one client address before it backs off
      (429 + Retry-After, its key unchecked, for 1 s doubling up to `auth_backoff_max_s`); 0/None: off.
    - `max_body_bytes`: the largest request body; a larger one is 413 before more is read (None: no limit).
    - `bind_host`: where the caller will listen; keys off beyond loopback logs a warning.
    - `strict_fields`: request fields neither OpenAI nor a known extension defines are a 400
      instead of being ignored with a warning (sdk.protocol.request_fields).
    - `feedback_per_minute`: POST /v1/feedback calls a minute per key (or address), with a cascade.
    """

    served_model_names: tuple[str, ...] | None = None
    api_keys: frozenset[str] = frozenset()
    rate_limit_per_minute: float | None = None
    rate_limit_burst: float | None = None
    max_concurrent_per_key: int | None = None
    auth_backoff_after: int | None = DEFAULT_AUTH_BACKOFF_AFTER
    auth_backoff_max_s: float = DEFAULT_AUTH_BACKOFF_MAX_S
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    bind_host: str | None = None
    strict_fields: bool = False
    feedback_per_minute: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.api_keys, str):  # frozenset("key") would be a set of its characters
            raise TypeError("api_keys must be a collection of keys, not a single string")
        object.__setattr__(self, "api_keys", frozenset(self.api_keys))
        if any(not key.strip() for key in self.api_keys):
            raise ValueError("api_keys holds an empty key")
        if self.served_model_names is not None:
            if isinstance(self.served_model_names, str):
                raise TypeError("served_model_names must be a list of names, not a single string")
            object.__setattr__(self, "served_model_names", tuple(self.served_model_names))
            if not self.served_model_names:
                raise ValueError("served_model_names must name at least one model, or be None to use the engine's name")
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1 (or None for no limit), got {self.max_body_bytes}")
        if self.rate_limit_per_minute is None and self.rate_limit_burst is not None:
            raise ValueError("rate_limit_burst needs rate_limit_per_minute")

    def client_limits(self, clock: Callable[[], float] = time.monotonic, state=None) -> ClientLimits:
        """The per-client limits these settings name; build them once to share them with another
        listener of the process (`tandem cloud serve`'s gRPC port): one budget per key. `state`: the
        state database the replicas share (sdk.state.database.StateDatabase): the limits are kept there."""
        if state is not None:
            from sdk.serving.shared_limits import shared_client_limits

            return shared_client_limits(
                state,
                self.rate_limit_per_minute,
                self.rate_limit_burst,
                self.max_concurrent_per_key,
                self.auth_backoff_after,
                self.auth_backoff_max_s,
            )
        return ClientLimits.build(
            self.rate_limit_per_minute,
            self.rate_limit_burst,
            self.max_concurrent_per_key,
            clock,
            self.auth_backoff_after,
            self.auth_backoff_max_s,
        )


APP_CONFIG_FIELDS = frozenset(f.name for f in fields(AppConfig))
