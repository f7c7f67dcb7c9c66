"""The per-client limits replicas share in the state database (sdk.serving.shared_limits; one process
keeps them in memory, sdk.serving.client_limits). Clients are the SHA-256 of their identity; times are
the replicas' wall clocks, in seconds since the epoch."""

from __future__ import annotations

from sdk.state.declaration import Column, Index, Table, Type

# One token bucket per client, deleted once it would be full again (`full_at`): a fresh one is the same.
RATE_BUCKETS = Table(
    None,
    "tandem_rate_buckets",
    (
        Column("client", Type.TEXT),
        Column("tokens", Type.REAL, not_null=True),
        Column("updated_at", Type.REAL, not_null=True),
        Column("full_at", Type.REAL, not_null=True),
    ),
    primary_key=("client",),
)

# Requests in flight as one count per (client, replica): schema v1's, kept for replicas of schema 4 while a
# fleet upgrades (their counts are not added to IN_FLIGHT_REQUESTS').
IN_FLIGHT = Table(
    None,
    "tandem_in_flight",
    (
        Column("client", Type.TEXT, not_null=True),
        Column("replica", Type.TEXT, not_null=True),
        Column("count", Type.INTEGER, not_null=True),
    ),
    primary_key=("client", "replica"),
    indexes=(Index("by_replica", ("replica",)),),
)

# A row per request's slot in flight (schema v5): giving one back is a DELETE a retry repeats harmlessly.
IN_FLIGHT_REQUESTS = Table(
    None,
    "tandem_in_flight_requests",
    (
        Column("slot", Type.TEXT),
        Column("client", Type.TEXT, not_null=True),
        Column("replica", Type.TEXT, not_null=True),
    ),
    primary_key=("slot",),
    indexes=(Index("by_client", ("client",)), Index("by_replica", ("replica",))),
)

# Failed keys per client address: the count, the last, the end of the wait it started, when it is forgotten.
AUTH_FAILURES = Table(
    None,
    "tandem_auth_failures",
    (
        Column("address", Type.TEXT),
        Column("count", Type.INTEGER, not_null=True),
        Column("last_at", Type.REAL, not_null=True),
        Column("until_at", Type.REAL, not_null=True),
        Column("forget_at", Type.REAL, not_null=True),
    ),
    primary_key=("address",),
)

TABLES = (RATE_BUCKETS, IN_FLIGHT, IN_FLIGHT_REQUESTS, AUTH_FAILURES)
