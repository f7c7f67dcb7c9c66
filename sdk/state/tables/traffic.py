"""The traffic record (sdk.traffic): in a SQLite file (its own migrations, sdk.traffic.schema) or the state
database's schema `tandem_traffic` (schema v2), the same tables and columns, so the statements that write
and read a record (sdk.traffic.store, rows, table) run unchanged on either. Text columns stay NULL unless
`record_text` is on; vectors are little-endian float32 BLOBs."""

from __future__ import annotations

from sdk.state.declaration import Column, Index, Table, Type

META = Table("meta", None, (Column("key", Type.TEXT), Column("value", Type.TEXT, not_null=True)), primary_key=("key",))

# One row per routed request.
REQUESTS = Table(
    "requests",
    "tandem_traffic.requests",
    (
        Column("id", Type.TEXT),  # the response id the client got (chatcmpl-...)
        Column("created_at", Type.REAL, not_null=True),  # seconds since the epoch
        Column("key_fingerprint", Type.TEXT),  # the caller's key id; NULL without keys
        Column("model", Type.TEXT, not_null=True),  # what the request asked for: auto, auto:0.4, local, cloud
        Column("tier", Type.TEXT, not_null=True),  # the tier that answered
        Column("escalated", Type.INTEGER, not_null=True),
        Column("reason", Type.TEXT, not_null=True),  # router.decision.Reason
        Column("decided_by", Type.TEXT),
        Column("degraded_reason", Type.TEXT),
        Column("confidence", Type.REAL),
        Column("decided_at_token", Type.INTEGER),
        Column("finish_reason", Type.TEXT),
        Column("router_score", Type.REAL),  # the prompt router's score, when it ran
        Column("router", Type.TEXT),  # which router file scored it
        Column("latency_ms", Type.REAL),  # arrival to the last token
        Column("local_prompt_tokens", Type.INTEGER),
        Column("local_completion_tokens", Type.INTEGER),
        Column("cloud_prompt_tokens", Type.INTEGER),
        Column("cloud_completion_tokens", Type.INTEGER),
        Column("cost_usd", Type.REAL),
        Column("signals", Type.TEXT),  # JSON: the local answer's confidence features when it ended
        Column("shape", Type.BLOB),  # router.prompt_router.prompt_shape
        Column("shape_version", Type.INTEGER),
        Column("embedding", Type.BLOB),  # MiniLM vector
        Column("embedder", Type.TEXT),  # what made it (fingerprint|precision)
        Column("prompt_text", Type.TEXT),  # NULL unless record_text
        Column("answer_text", Type.TEXT),
    ),
    primary_key=("id",),
    # A file is one process's; the state database also finds a key's rows for `tandem traffic purge`.
    indexes=(Index("by_time", ("created_at",)), Index("by_key", ("key_fingerprint",), in_sqlite=False)),
)

# Labels that arrive later: one per response and source, so a repeat replaces itself.
LABELS = Table(
    "labels",
    "tandem_traffic.labels",
    (
        Column("response_id", Type.TEXT, not_null=True, references=(REQUESTS, "id")),
        Column("source", Type.TEXT, not_null=True),  # feedback | shadow
        Column("weak", Type.REAL),  # how right the local tier was, in [0, 1]; NULL: not said
        Column("strong", Type.REAL),  # the cloud tier, likewise
        Column("created_at", Type.REAL, not_null=True),
        Column("detail", Type.TEXT),  # the judge, or "thumbs"/"score"
    ),
    primary_key=("response_id", "source"),
)

# Per-day counts of what is deliberately not stored row by row (privacy-flagged requests, dropped rows).
COUNTERS = Table(
    "counters",
    "tandem_traffic.counters",
    (
        Column("day", Type.TEXT, not_null=True),
        Column("name", Type.TEXT, not_null=True),
        Column("value", Type.BIGINT, not_null=True),
    ),
    primary_key=("day", "name"),
)

# Routers a background retrain swapped in, for the other replicas (sdk.traffic.shared_routers).
ROUTERS = Table(
    None,
    "tandem_traffic.routers",
    (
        Column("id", Type.BIGSERIAL),
        Column("name", Type.TEXT, not_null=True),
        Column("created_at", Type.TIMESTAMP, not_null=True, default="now()"),
        Column("replica", Type.TEXT, not_null=True),
        Column("detail", Type.TEXT, not_null=True),
        Column("onnx", Type.BLOB, not_null=True),
    ),
    primary_key=("id",),
)

TABLES = (META, REQUESTS, LABELS, COUNTERS, ROUTERS)
# What a record's size bound measures (its rows; meta and the routers are no traffic).
RECORD_TABLES = (REQUESTS, LABELS, COUNTERS)
