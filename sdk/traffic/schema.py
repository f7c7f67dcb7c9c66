"""The traffic record's SQLite schema, versioned: `migrate` brings any older file up to
SCHEMA_VERSION in one transaction per step, and refuses a file written by a newer tandem.

One row per routed request (`requests`), the labels that arrive for it later (`labels`: one
per response and source, so repeated feedback replaces itself), per-day counters of what is
deliberately not stored (`counters`: privacy-flagged requests, dropped rows), and `meta`.
Vectors are little-endian float32 BLOBs; text columns stay NULL unless `record_text` is on.

The tables are declared once in sdk.state.tables.traffic, beside their PostgreSQL twins in the state
database; these migrations have shipped and stay as written, and tests/state/test_declared_tables.py
checks the file they make against the declarations. A new step is written from the changed declaration.
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 1

# MIGRATIONS[n] takes a file from version n to n + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE requests (
        id TEXT PRIMARY KEY,                -- the response id the client got (chatcmpl-...)
        created_at REAL NOT NULL,           -- unix seconds
        key_fingerprint TEXT,               -- sdk.serving.api_keys.key_fingerprint of the caller's key; \
NULL without keys
        model TEXT NOT NULL,                -- what the request asked for: auto, auto:0.4, local, cloud
        tier TEXT NOT NULL,                 -- the tier that answered
        escalated INTEGER NOT NULL,
        reason TEXT NOT NULL,               -- router.decision.Reason (why it went where it went)
        decided_by TEXT,
        degraded_reason TEXT,
        confidence REAL,
        decided_at_token INTEGER,
        finish_reason TEXT,
        router_score REAL,                  -- the prompt router's score, when it ran
        router TEXT,                        -- which router file scored it
        latency_ms REAL,                    -- arrival to the last token
        local_prompt_tokens INTEGER, local_completion_tokens INTEGER,
        cloud_prompt_tokens INTEGER, cloud_completion_tokens INTEGER,
        cost_usd REAL,
        signals TEXT,                       -- JSON: the local answer's confidence features when it ended
        shape BLOB, shape_version INTEGER,  -- router.prompt_router.prompt_shape
        embedding BLOB, embedder TEXT,      -- MiniLM vector and what made it (fingerprint|precision)
        prompt_text TEXT, answer_text TEXT  -- NULL unless record_text
    );
    CREATE INDEX requests_by_time ON requests (created_at);
    CREATE TABLE labels (
        response_id TEXT NOT NULL REFERENCES requests (id) ON DELETE CASCADE,
        source TEXT NOT NULL,               -- feedback | shadow
        weak REAL,                          -- how right the local tier was, in [0, 1]; NULL: not said
        strong REAL,                        -- the cloud tier, likewise
        created_at REAL NOT NULL,
        detail TEXT,                        -- the judge, or "thumbs"/"score"
        PRIMARY KEY (response_id, source)
    );
    CREATE TABLE counters (day TEXT NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (day, name));
    """,
]


class TrafficSchemaError(RuntimeError):
    """The file is not a traffic record this tandem can use."""


def schema_version(conn: sqlite3.Connection) -> int:
    """0 for an empty file; TrafficSchemaError for a file with tables but no version."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return 0
    if "meta" not in tables:
        raise TrafficSchemaError(f"it holds tables {sorted(tables)} but no tandem schema version: not a traffic record")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise TrafficSchemaError("its meta table has no schema_version")
    return int(row[0])


def migrate(conn: sqlite3.Connection, migrations: list[str] | None = None) -> int:
    """Apply the pending migrations (each in its own transaction); returns the version reached."""
    migrations = MIGRATIONS if migrations is None else migrations
    version = schema_version(conn)
    if version > len(migrations):
        raise TrafficSchemaError(
            f"schema version {version} is newer than this tandem's ({len(migrations)}); upgrade tandem"
        )
    for step in range(version, len(migrations)):
        try:
            conn.execute("BEGIN IMMEDIATE")
            for statement in _statements(migrations[step]):
                conn.execute(statement)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(step + 1),))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(migrations)


def _statements(script: str) -> list[str]:
    """A migration script's statements (comments dropped; sqlite3 runs one statement per execute)."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [statement.strip() for statement in "\n".join(lines).split(";") if statement.strip()]
