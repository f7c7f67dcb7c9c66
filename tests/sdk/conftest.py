"""The two stores of responses every stored-responses test runs against: a SQLite file of the process and
the state database the replicas share (sdk.response_store.postgres_store, on a throwaway PostgreSQL)."""

from __future__ import annotations

import pytest

from sdk.response_store import StoreSettings
from sdk.response_store.sqlite_store import SQLiteResponseStore


@pytest.fixture(params=["sqlite", "postgres"])
def open_response_store(request, tmp_path):
    """A function (settings, clock) -> a store of responses; the SQLite ones are closed after the test."""
    if request.param == "sqlite":
        opened = []

        def sqlite(settings: StoreSettings | None = None, clock=None):
            opened.append(SQLiteResponseStore(tmp_path / "responses.sqlite3", settings or StoreSettings(), clock))
            return opened[-1]

        yield sqlite
        for store in opened:
            store._conn.close()
        return
    from sdk.response_store.postgres_store import PostgresResponseStore

    db = request.getfixturevalue("state_db")
    yield lambda settings=None, clock=None: PostgresResponseStore(db, settings or StoreSettings(), clock)


@pytest.fixture
def response_store(open_response_store):
    """A store of each kind with the default bounds."""
    return open_response_store()
