"""[server] and [cloud_server]: the listeners of `tandem serve` and `tandem cloud serve`.

The keys both servers share (where they listen, who may use them, what they refuse) are declared
once, on `ListenerConfig`, and make both sections; each section keeps its own env variables
(TANDEM_HOST / TANDEM_CLOUD_HOST) and, where they differ, its own check and help text (`rate_limit`:
0 is refused in [server], and means "no limit" in [cloud_server], as it always has). What only
`tandem cloud serve` has (the gRPC port, torch's threads, prices, the admin key, the drain grace)
is `HostedCloudConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdk.serving.client_limits import DEFAULT_AUTH_BACKOFF_AFTER, DEFAULT_AUTH_BACKOFF_MAX_S
from sdk.protocol.config_fields import at_least, one_of, setting
from sdk.protocol.drafts import DRAFTS_PER_SECOND, MAX_DRAFTS_OUTSTANDING, MAX_SUPPORT_TOKENS
from sdk.settings.setting_field import fields_of

if TYPE_CHECKING:
    from sdk.openai_server.app_config import AppConfig

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
_PORT = at_least(0, high=65535)


def _postgresql_url(value: str) -> None:
    if not value.startswith(("postgresql://", "postgres://")):
        raise ValueError("must be a postgresql:// URL")


@dataclass(frozen=True)
class ListenerConfig:
    """A server's listener: [server] for `tandem serve`, [cloud_server] for `tandem cloud serve`."""

    host: str = setting("127.0.0.1", "Address the server binds (0.0.0.0 for all; use keys and TLS then).")
    port: int = setting(8000, "TCP port of the OpenAI HTTP API.", check=_PORT)
    log_level: str = setting("info", "Server log level.", check=one_of(*LOG_LEVELS))
    api_key_file: str | None = setting(
        None,
        "Keys clients must present, one per line (TANDEM_API_KEYS adds comma-separated ones).",
        unset="no key file",
    )
    rate_limit: float | None = setting(
        None,
        "Requests per minute per key (per client address without keys).",
        unset="no limit",
        check=at_least(0, inclusive=False),
    )
    max_concurrent_per_key: int | None = setting(
        None,
        "Requests (streams included) in flight at once per key (per client address without keys); one more is 429.",
        unset="no limit",
        check=at_least(1),
    )
    auth_backoff_after: int = setting(
        DEFAULT_AUTH_BACKOFF_AFTER,
        "Failed API keys from one client address before it must wait (1 s, doubling to auth_backoff_max_s) and its "
        "requests get 429 unchecked; 0: off.",
        check=at_least(0),
    )
    auth_backoff_max_s: float = setting(
        DEFAULT_AUTH_BACKOFF_MAX_S,
        "Longest wait of a client address backing off after failed API keys, seconds.",
        check=at_least(1),
    )
    strict_fields: bool = setting(
        False,
        "Refuse request fields neither OpenAI nor a known extension defines (400) instead of ignoring them with a "
        "warning.",
    )
    max_body_bytes: int = setting(
        4 * 1024 * 1024,
        "Largest HTTP request body, bytes; a larger one is 413 before it is read.",
        check=at_least(1024),
    )
    budgets_file: str | None = setting(
        None,
        "Spend limits in USD per API key and per `user` (TOML, reloaded when it changes; see docs/configuration.md, "
        "Budgets): over a hard one, 429 insufficient_quota.",
        unset="no budgets",
    )
    spend_path: str | None = setting(
        None,
        "Where spend against the budgets is kept (SQLite; survives restarts).",
        unset="$TANDEM_DATA_DIR/spend.sqlite3, else ~/.local/share/tandem/spend.sqlite3",
    )
    state_db: str | None = setting(
        None,
        "PostgreSQL URL (postgresql://user:password@host/db) of the state database every replica of this server "
        "shares: spend and budget reservations, rate limits, requests in flight, failed-key backoff "
        "(docs/cloud-at-scale.md, More than one replica).",
        unset="per process: spend_path's SQLite file and memory",
        check=_postgresql_url,
        secret=True,
    )
    state_db_lease_s: float = setting(
        30.0,
        "With state_db: seconds a replica that stopped answering (killed, host lost) keeps holding its budget "
        "reservations and requests in flight before the other replicas delete them.",
        check=at_least(1),
    )
    state_db_timeout_s: float = setting(
        1.5,
        "With state_db: the client-side deadline of every call to it, seconds (a frozen server answers nothing, "
        "so no server-side timeout can fire). Past it a budgeted request gets 503 state_database_unavailable and "
        "one without a budget is served on this replica's own limits.",
        check=at_least(0.05),
    )
    state_db_max_pending_writes: int = setting(
        10_000,
        "With state_db: writes that may wait for it (settles, returned slots, stored responses) before budgeted "
        "requests get 503 until they drain; settles are never dropped, a stored response past it is.",
        check=at_least(1),
    )
    store_responses: bool = setting(
        True,
        "Keep what POST /v1/responses answers (store: true, OpenAI's default) so previous_response_id continues it "
        "and GET/DELETE /v1/responses/{id} reach it, for the key that made it; privacy-flagged requests are never "
        "kept.",
    )
    responses_path: str | None = setting(
        None,
        "Where stored responses are kept (SQLite, created 0600). With state_db they are kept in that database, "
        "shared by the replicas, and this stays unset.",
        unset="$TANDEM_DATA_DIR/responses.sqlite3, else ~/.local/share/tandem/responses.sqlite3",
    )
    responses_retention_days: float = setting(
        30.0, "Stored responses older than this are deleted.", check=at_least(0, inclusive=False)
    )
    responses_max_mb: float = setting(
        256.0,
        "Largest size of all stored responses; a store past it deletes the storing key's oldest (never another "
        "key's), and keeps nothing of that key when they free too little.",
        check=at_least(1),
    )
    responses_max_mb_per_key: float = setting(
        32.0,
        "Largest size of one API key's stored responses (at most responses_max_mb); a store past it deletes that "
        "key's oldest.",
        check=at_least(0, inclusive=False),
    )
    responses_max_row_mb: float = setting(
        2.0,
        "Largest stored response (its conversation and response object; at most responses_max_mb_per_key): a "
        "request whose stored response would be larger is refused (400, param store) before it runs, and an "
        "answer that makes it larger is sent with store: false.",
        check=at_least(0, inclusive=False),
    )
    tls_cert: str | None = setting(
        None, "PEM certificate chain: the server speaks TLS (with tls_key).", unset="plaintext"
    )
    tls_key: str | None = setting(None, "PEM private key for tls_cert.", unset="plaintext")


@dataclass(frozen=True)
class HostedCloudConfig:
    """What `tandem cloud serve` adds to its listener ([cloud_server])."""

    grpc_port: int = setting(50051, "gRPC port.", check=_PORT)
    threads: int | None = setting(
        None,
        "CPU threads of torch's kernels; several replicas on one host need their share each.",
        unset="torch's (one per core)",
        check=at_least(1),
    )
    price_input_per_million: float = setting(
        0.0, "USD per million prompt tokens this server charges (budgets bill at it).", check=at_least(0)
    )
    price_output_per_million: float = setting(0.0, "USD per million completion tokens.", check=at_least(0))
    admin_key_file: str | None = setting(
        None,
        "File holding the admin key of POST /admin/drain and /admin/resume (take this replica out of rotation and "
        "back).",
        unset="no admin endpoints",
    )
    drain_grace_s: float = setting(
        30.0,
        "On SIGTERM: seconds the requests in flight get to finish while health says NOT_SERVING and new ones are "
        "refused.",
        check=at_least(0),
    )
    # What GenerateWithDrafts takes of one request's drafts (sdk.serving.grpc.draft_door); the tokens of one draft
    # are the engine's ([cloud] max_draft_tokens).
    draft_max_support: int = setting(
        MAX_SUPPORT_TOKENS,
        "GenerateWithDrafts: the most token ids in one draft token's support (the distribution it was drawn from); "
        "more is INVALID_ARGUMENT.",
        check=at_least(1, high=4096),
    )
    drafts_per_second: float = setting(
        DRAFTS_PER_SECOND,
        "GenerateWithDrafts: draft messages one request may send a second (in bursts of as many); faster is "
        "RESOURCE_EXHAUSTED.",
        check=at_least(1),
    )
    drafts_max_outstanding: int = setting(
        MAX_DRAFTS_OUTSTANDING,
        "GenerateWithDrafts: draft messages of one request the engine has not taken yet; one more is "
        "RESOURCE_EXHAUSTED (the engine keeps only the latest of them).",
        check=at_least(1),
    )


SERVER_FIELDS = fields_of(ListenerConfig, "server", env_prefix="TANDEM_")
CLOUD_SERVER_FIELDS = fields_of(
    ListenerConfig,
    "cloud_server",
    env_prefix="TANDEM_CLOUD_",
    changes={
        "host": {"help": "Address both servers (gRPC and HTTP) bind (0.0.0.0 for all; use keys and TLS then)."},
        "rate_limit": {
            "help": "Requests per minute per key (per client address without keys), HTTP and gRPC together; "
            "0: no limit.",
            "check": at_least(0),
        },
        "max_concurrent_per_key": {
            "help": "Requests in flight at once per key (per client address without keys), HTTP and gRPC together."
        },
        "auth_backoff_after": {
            "help": "Failed keys (API keys and the admin key) from one client address before it backs off (HTTP 429 / "
            "gRPC RESOURCE_EXHAUSTED, its key unchecked, 1 s doubling); 0: off."
        },
        "max_body_bytes": {
            "help": "Largest HTTP request body, bytes; larger is 413 (gRPC has its own 4 MiB message limit)."
        },
        "tls_cert": {"help": "PEM certificate chain: TLS on both the gRPC and the HTTP port."},
    },
) + fields_of(HostedCloudConfig, "cloud_server", env_prefix="TANDEM_CLOUD_")


def app_config(
    listener: ListenerConfig,
    api_keys: frozenset[str],
    model_name: str | None,
    feedback_per_minute: float | None = None,
) -> AppConfig:
    """The OpenAI HTTP app's config for a listener (`api_keys`: read from its key file)."""
    from sdk.openai_server.app_config import AppConfig

    return AppConfig(
        served_model_names=(model_name,) if model_name else None,
        api_keys=api_keys,
        bind_host=listener.host,
        rate_limit_per_minute=listener.rate_limit or None,  # [cloud_server] takes 0 for no limit
        max_concurrent_per_key=listener.max_concurrent_per_key,
        auth_backoff_after=listener.auth_backoff_after,
        auth_backoff_max_s=listener.auth_backoff_max_s,
        max_body_bytes=listener.max_body_bytes,
        strict_fields=listener.strict_fields,
        feedback_per_minute=feedback_per_minute,
    )
