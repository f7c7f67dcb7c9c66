"""The two places a traffic record lives, for the suite that runs on both (tests/traffic/test_record_backends.py):
a SQLite file and the state database the replicas share (sdk.traffic.postgres_store, on a throwaway PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def record_target(request, tmp_path) -> str:
    """Where a record goes: a file's path, or a fresh state database migrated by a replica that has since stopped."""
    if request.param == "sqlite":
        return str(tmp_path / "traffic.sqlite3")
    from sdk.state.database import StateDatabase

    url = request.getfixturevalue("state_db_url")

    async def migrate() -> None:
        await (await StateDatabase(url).open()).close()

    asyncio.run(migrate())
    return url
