"""The budgets' tables (sdk.budgets): what each (scope, period) has spent, in a SQLite file of the process
(sdk.budgets.ledger) or the state database (sdk.budgets.postgres_ledger), and the state database's
reservations of requests in flight and the settle batches that have landed (schema v1, v5).

    scope "key:<fingerprint>" or "user:<fingerprint>:<user>"; period "day:2026-11-25" or "month:2026-11"
"""

from __future__ import annotations

from sdk.state.declaration import Column, Index, Table, Type

SPEND = Table(
    "spend",
    "tandem_spend",
    (
        Column("scope", Type.TEXT, not_null=True),
        Column("period", Type.TEXT, not_null=True),
        Column("usd", Type.REAL, not_null=True),
        Column("cloud_tokens", Type.BIGINT, not_null=True),
        Column("total_tokens", Type.BIGINT, not_null=True),
        Column("requests", Type.BIGINT, not_null=True),
    ),
    primary_key=("scope", "period"),
)

# USD a request in flight holds against each (scope, period) of its limits; one id per request (a sequence's).
RESERVATIONS = Table(
    None,
    "tandem_reservations",
    (
        Column("id", Type.BIGINT, not_null=True),
        Column("replica", Type.TEXT, not_null=True),  # held while this replica's lease runs (sdk.state.lease)
        Column("scope", Type.TEXT, not_null=True),
        Column("period", Type.TEXT, not_null=True),
        Column("usd", Type.REAL, not_null=True),
        Column("created_at", Type.TIMESTAMP, not_null=True, default="now()"),
    ),
    primary_key=("id", "scope", "period"),
    indexes=(Index("by_pair", ("scope", "period")), Index("by_replica", ("replica",))),
)

# The settle batches that landed, so a retry of one changes nothing (kept sdk.state.lease.SETTLED_KEEP).
SETTLED = Table(
    None,
    "tandem_settled",
    (
        Column("batch", Type.TEXT),
        Column("replica", Type.TEXT, not_null=True),
        Column("landed_at", Type.TIMESTAMP, not_null=True, default="now()"),
    ),
    primary_key=("batch",),
    indexes=(Index("by_time", ("landed_at",)),),
)

TABLES = (SPEND, RESERVATIONS, SETTLED)
