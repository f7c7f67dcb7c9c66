"""Rows owned by the 8-digit key fingerprints of earlier versions, moved to the full key ids
(sdk.serving.api_keys.key_fingerprint: the whole SHA-256 of the key) when a server starts.

What an earlier version kept under `sha256(key)[:8]`: stored responses (`key_fingerprint`), the
spend ledger's scopes (`key:<fp>`, `user:<fp>:<user>`) and budget reservations, and the traffic
record (`key_fingerprint`), in the SQLite files of the process and in the state database.

The rule: an 8-digit owner goes to the full id of the configured API key whose id starts with
it, the key it came from (the server knows its keys at start). Where no configured key starts
with it (a key since removed), or two do (then which one made a row cannot be told), its rows
stay as they are: no key's id is 8 digits, so no key reads, continues, deletes or is billed by
them, and retention deletes them in time. Spend rows merge into the full id's (added up) where
both exist. Every start runs it (a key configured later gets its old rows then); what is moved
once is never moved again. During a rolling upgrade, replicas of an earlier version still write
8-digit owners; the next start of an upgraded replica moves them too.

SQLite files are changed in one write transaction each; the state database in one transaction,
under the stored responses' advisory lock (its trigger keeps the per-key byte counts right).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from sdk.serving.api_keys import key_fingerprint
from sdk.state.tables.budgets import RESERVATIONS, SPEND
from sdk.state.tables.responses import RESPONSES
from sdk.state.tables.traffic import REQUESTS

logger = logging.getLogger("tandem.owners")

OLD_DIGITS = 8  # what earlier versions kept of the key's SHA-256
MIGRATION_TIMEOUT_S = 120.0  # the state database's rows moved at start (one transaction)


def old_owner_ids(api_keys: Iterable[str]) -> dict[str, str]:
    """{the 8 digits an earlier version kept: the full id} for each configured key whose 8 digits no other
    configured key shares (those rows stay unowned: which of the two made one cannot be told)."""
    by_old: dict[str, list[str]] = {}
    for key in api_keys:
        full = key_fingerprint(key)
        by_old.setdefault(full[:OLD_DIGITS], []).append(full)
    shared = sorted(old for old, ids in by_old.items() if len(ids) > 1)
    if shared:
        logger.warning(
            "configured API keys share the first %d digits of their ids (%s): what earlier versions kept under "
            "those digits stays unowned (no key reads it; retention deletes it)",
            OLD_DIGITS,
            ", ".join(shared),
        )
    return {old: ids[0] for old, ids in by_old.items() if len(ids) == 1}


# Spend moved from one scope to another, added to what the new one already has in the same period.
_MERGE_SPEND = """
INSERT INTO {table} (scope, period, usd, cloud_tokens, total_tokens, requests)
    SELECT {new_scope}, period, usd, cloud_tokens, total_tokens, requests FROM {table} WHERE {old_scope}
    ON CONFLICT (scope, period) DO UPDATE SET usd = {table}.usd + excluded.usd,
        cloud_tokens = {table}.cloud_tokens + excluded.cloud_tokens,
        total_tokens = {table}.total_tokens + excluded.total_tokens, requests = {table}.requests + excluded.requests
"""


def _scope_moves(mark: str) -> list[tuple[str, str]]:
    """(the new scope's expression, the old scopes' condition) for a key's scope and for its users' scopes
    (sdk.budgets.ledger.key_scope, user_scope); `mark` is the driver's placeholder: the new id, then the old."""
    user_head = len("user:") + OLD_DIGITS + len(":")
    return [
        (f"'key:' || {mark}", f"scope = 'key:' || {mark}"),
        (
            f"'user:' || {mark} || ':' || substr(scope, {user_head + 1})",
            f"substr(scope, 1, {user_head}) = 'user:' || {mark} || ':'",
        ),
    ]


def migrate_sqlite_file(path: str | Path, ids: dict[str, str]) -> dict[str, int]:
    """Move the owners of one SQLite file of the process: whichever of tandem's tables it holds (stored
    responses, spend, the traffic record's requests). {table: rows moved}; a missing file is left alone."""
    path = Path(path)
    if not ids or not path.is_file():
        return {}
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=10.0)
    moved: dict[str, int] = {}
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        owned = [table for table in (RESPONSES.sqlite, REQUESTS.sqlite) if table in tables]
        if not owned and SPEND.sqlite not in tables:
            return {}
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TEMP TABLE owner_ids (old TEXT PRIMARY KEY, new TEXT NOT NULL)")
            conn.executemany("INSERT INTO owner_ids VALUES (?, ?)", ids.items())
            for table in owned:
                moved[table] = conn.execute(
                    f"UPDATE {table} SET key_fingerprint = (SELECT new FROM owner_ids WHERE old = key_fingerprint) "
                    "WHERE key_fingerprint IN (SELECT old FROM owner_ids)"
                ).rowcount
            if SPEND.sqlite in tables:
                moved[SPEND.sqlite] = _move_spend(conn, SPEND.sqlite, "?", ids)
            conn.execute("DROP TABLE owner_ids")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()
    return {table: n for table, n in moved.items() if n}


def _move_spend(conn, table: str, mark: str, ids: dict[str, str]) -> int:
    """Every scope of each old id merged into its new id's (one statement pair per id: scopes are few)."""
    moved = 0
    for new_scope, old_scope in _scope_moves(mark):
        merge = _MERGE_SPEND.format(table=table, new_scope=new_scope, old_scope=old_scope)
        for old, new in ids.items():
            conn.execute(merge, (new, old))
            moved += conn.execute(f"DELETE FROM {table} WHERE {old_scope}", (old,)).rowcount
    return moved


async def migrate_state_database(state, ids: dict[str, str]) -> dict[str, int]:
    """Move the owners in the state database the replicas share (sdk.state.database.StateDatabase, migrated):
    stored responses, spend, reservations and the traffic record. {table: rows moved}."""
    from sdk.response_store.postgres_store import RESPONSES_LOCK

    if not ids:
        return {}
    olds, news = list(ids), [ids[old] for old in ids]
    pairs = "SELECT * FROM unnest(%s::text[], %s::text[]) AS m(old, new)"
    moved: dict[str, int] = {}

    async def move(conn) -> None:
        async with conn.transaction():
            # A start-up step over every row: not under the per-call statement limit the pool's sessions set.
            await conn.execute("SET LOCAL statement_timeout = 0")
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (RESPONSES_LOCK,))
            # coalesce: what tandem_responses_by_owner indexes.
            for table, owner in (
                (RESPONSES.postgres, "coalesce(t.key_fingerprint, '')"),
                (REQUESTS.postgres, "t.key_fingerprint"),
            ):
                cursor = await conn.execute(
                    f"UPDATE {table} AS t SET key_fingerprint = m.new FROM ({pairs}) AS m WHERE {owner} = m.old",
                    (olds, news),
                )
                moved[table] = cursor.rowcount
            for new_scope, old_scope in _scope_moves("%s"):
                reservations = 0
                for old, new in ids.items():
                    cursor = await conn.execute(
                        f"UPDATE {RESERVATIONS.postgres} SET scope = {new_scope} WHERE {old_scope}", (new, old)
                    )
                    reservations += cursor.rowcount
                moved[RESERVATIONS.postgres] = moved.get(RESERVATIONS.postgres, 0) + reservations
            moved[SPEND.postgres] = await _move_state_spend(conn, ids)

    await state.run(move, timeout_s=MIGRATION_TIMEOUT_S)
    return {table: n for table, n in moved.items() if n}


async def _move_state_spend(conn, ids: dict[str, str]) -> int:
    moved = 0
    for new_scope, old_scope in _scope_moves("%s"):
        merge = _MERGE_SPEND.format(table=SPEND.postgres, new_scope=new_scope, old_scope=old_scope)
        for old, new in ids.items():
            await conn.execute(merge, (new, old))
            cursor = await conn.execute(f"DELETE FROM {SPEND.postgres} WHERE {old_scope}", (old,))
            moved += cursor.rowcount
    return moved


async def migrate_owners(api_keys: Iterable[str], files: Iterable[str | Path], state=None) -> dict[str, int]:
    """At a server's start, before its stores open: the files of the process (those that exist) and the state
    database (when `state` is given) moved to full ids. Logs what moved; {where: rows moved}."""
    ids = old_owner_ids(api_keys)
    moved: dict[str, int] = {}
    for path in dict.fromkeys(str(path) for path in files):
        for table, n in (await asyncio.to_thread(migrate_sqlite_file, path, ids)).items():
            moved[f"{path}:{table}"] = n
    if state is not None:
        for table, n in (await migrate_state_database(state, ids)).items():
            moved[f"{state.where}:{table}"] = n
    if moved:
        logger.info(
            "rows of earlier versions moved from 8-digit key fingerprints to full key ids: %s",
            ", ".join(f"{where} {n}" for where, n in moved.items()),
        )
    return moved


def owner_files(listener, traffic=None) -> list[str]:
    """The SQLite files a server's settings name (or default to) that may hold owners: spend, stored responses,
    and the traffic record when `traffic` (the [traffic] settings of tandem serve) is given."""
    from sdk.budgets.manager import default_spend_path
    from sdk.data_dir import data_path

    files = [listener.spend_path or default_spend_path(), listener.responses_path or data_path("responses.sqlite3")]
    if traffic is not None:
        files.append(traffic.record_path)
    return files


async def migrate_owners_at_start(listener, api_keys: Iterable[str], state=None, traffic=None) -> None:
    """migrate_owners over what a server's settings name, before its stores open. A failure is logged and the
    server starts: the rows it did not move stay unowned until a later start moves them (nothing is lost)."""
    if not api_keys:  # a server without keys owns nothing by key
        return
    try:
        await migrate_owners(api_keys, owner_files(listener, traffic), state)
    except Exception:  # any store's error (locked file, database away): moving owners must not stop the server
        logger.exception("rows of earlier versions were not moved to full key ids (a later start tries again)")
