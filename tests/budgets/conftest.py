"""The two spend ledgers every budget test runs against: this process's (SQLite + memory) and the
state database the replicas share (sdk.budgets.postgres_ledger, on a throwaway PostgreSQL)."""

from __future__ import annotations

import pytest

from sdk.budgets.ledger import Ledger, SpendLedger


@pytest.fixture(params=["local", "postgres"])
def open_ledger(request, tmp_path):
    """A function (clock=time.time) -> a spend ledger (each answers the Ledger protocol the budget manager is typed
    by); the SQLite ones are closed after the test."""
    if request.param == "local":
        opened = []

        def local(clock=None):
            opened.append(SpendLedger(tmp_path / "spend.sqlite3", **({"clock": clock} if clock else {})).start())
            assert isinstance(opened[-1], Ledger)
            return opened[-1]

        yield local
        for ledger in opened:
            ledger.close()
        return
    from sdk.budgets.postgres_ledger import PostgresSpendLedger

    db = request.getfixturevalue("state_db")

    def postgres(clock=None):
        ledger = PostgresSpendLedger(db, **({"clock": clock} if clock else {}))
        assert isinstance(ledger, Ledger)
        return ledger

    yield postgres


async def kept_spend(ledger, scope: str) -> float:
    """What `ledger` kept for `scope` today where it persists it: a SQLite ledger's file read back by a
    fresh ledger (what a restart would see), the state database as it is."""
    await ledger.settled()
    if not isinstance(ledger, SpendLedger):
        return (await ledger.current(scope, "day")).usd
    ledger.flush()
    reopened = SpendLedger(ledger.path, clock=ledger.clock).start()
    try:
        return (await reopened.current(scope, "day")).usd
    finally:
        reopened.close()
