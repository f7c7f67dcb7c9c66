"""Stored responses (sdk.response_store): in a SQLite file of the process or the state database (schema
v4, v5), the same columns in the same order. The order matters beyond the declaration: schema v5's
`tandem_keep_response` inserts a row by position, so the check of this table (tests/state/
test_declared_tables.py) holds the columns' order too."""

from __future__ import annotations

from sdk.state.declaration import Column, Index, Table, Type

RESPONSES = Table(
    "responses",
    "tandem_responses",
    (
        Column("id", Type.TEXT),
        Column("key_fingerprint", Type.TEXT),  # the owner: a key's whole SHA-256 (NULL on a server without keys)
        Column("created_at", Type.REAL, not_null=True),  # seconds since the epoch
        Column("bytes", Type.INTEGER, not_null=True),  # what it counts against the bounds (stored.row_bytes)
        Column("conversation", Type.TEXT, not_null=True),  # JSON: the chat messages it ends
        Column("response", Type.TEXT, not_null=True),  # JSON: the response object as answered
    ),
    primary_key=("id",),
    indexes=(
        Index("by_time", ("created_at",)),
        # A key's rows, oldest first: SQLite matches the owner with IS, PostgreSQL as coalesce(owner, '').
        Index(
            "by_owner", ("key_fingerprint", "created_at"), postgres=("(coalesce(key_fingerprint, ''))", "created_at")
        ),
    ),
)

# The bytes each key's rows hold ('' for a server without keys), kept by triggers on RESPONSES.
RESPONSE_OWNERS = Table(
    "response_owners",
    "tandem_response_owners",
    (Column("owner", Type.TEXT), Column("bytes", Type.BIGINT, not_null=True)),
    primary_key=("owner",),
    without_rowid=True,
)

TABLES = (RESPONSES, RESPONSE_OWNERS)
