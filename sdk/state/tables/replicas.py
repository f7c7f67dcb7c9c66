"""The state database's own tables: each replica's lease (sdk.state.lease) and the schema version its
migrations reached (sdk.state.database)."""

from __future__ import annotations

from sdk.state.declaration import Column, Table, Type

REPLICAS = Table(
    None,
    "tandem_replicas",
    (
        Column("id", Type.TEXT),
        Column("started_at", Type.TIMESTAMP, not_null=True, default="now()"),
        Column("expires_at", Type.TIMESTAMP, not_null=True),  # the database's clock: what the heartbeat pushes on
    ),
    primary_key=("id",),
)

# One row per migration applied (made before any migration runs, so it is no migration's).
SCHEMA_VERSIONS = Table(None, "tandem_schema", (Column("version", Type.INTEGER, not_null=True),), primary_key=())

TABLES = (REPLICAS, SCHEMA_VERSIONS)
