"""The state database replicas share (sdk.state): opening it, its schema versions, leases that end
with a replica that died, and what requests see while it is away and when it is back."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from sdk.budgets.ledger import Reservation, Shortfall, periods
from sdk.budgets.postgres_ledger import PostgresSpendLedger
from sdk.protocol.errors import StateUnavailableError
from sdk.state import database as state_database
from sdk.state.database import StateDatabase, StateDatabaseError
from sdk.state.redaction import check_url, redacted
from sdk.state.schema import LATEST, MIGRATIONS

# The ledgers run on a fixed clock: settle bills the periods of its clock's day, which must be PAIR's.
NOW = 1_795_000_000.0  # 2026-11-18 UTC
PAIR = ("key:k", periods(NOW)["day"])


def ledger_of(db: StateDatabase) -> PostgresSpendLedger:
    return PostgresSpendLedger(db, clock=lambda: NOW)


def test_only_postgresql_urls_are_taken_and_passwords_never_shown():
    with pytest.raises(ValueError, match="postgresql://"):
        check_url("sqlite:///tmp/x")
    assert (
        redacted("postgresql://tandem:s3cret@db.example:5433/state") == "postgresql://tandem:***@db.example:5433/state"
    )
    assert redacted("postgresql://db/state") == "postgresql://db/state"
    # The password in the query string, and a key=value connection string (check_url's refusal prints it).
    assert redacted("postgresql://db/state?user=t&password=s3cret&sslmode=require") == (
        "postgresql://db/state?user=t&password=***&sslmode=require"
    )
    assert redacted("host=db user=t password=s3cret dbname=state") == "host=db user=t password=*** dbname=state"
    assert redacted("host=db password='s3 cret' port=5") == "host=db password=*** port=5"
    with pytest.raises(ValueError) as refused:
        check_url("host=db.example user=t password=s3cret dbname=state")
    assert "s3cret" not in str(refused.value)


async def test_an_unreachable_database_refuses_to_start_naming_it(monkeypatch):
    monkeypatch.setattr(state_database, "CONNECT_TIMEOUT_S", 2.0)
    from tests.conftest import free_port

    url = f"postgresql://tandem:s3cret@127.0.0.1:{free_port()}/state"
    started = time.monotonic()
    with pytest.raises(StateDatabaseError) as refused:
        await StateDatabase(url).open()
    assert "the state database postgresql://tandem:***@127.0.0.1" in str(refused.value)
    assert "cannot be reached" in str(refused.value) and "s3cret" not in str(refused.value)
    assert time.monotonic() - started < 15


async def test_the_schema_is_made_once_and_a_newer_one_is_refused(state_db_url):
    first, second = await asyncio.gather(StateDatabase(state_db_url).open(), StateDatabase(state_db_url).open())
    with psycopg.connect(state_db_url) as conn:
        versions = conn.execute("SELECT version FROM tandem_schema ORDER BY version").fetchall()
        assert versions == [(number,) for number, _ in MIGRATIONS]  # each step once, though two replicas raced
        assert conn.execute("SELECT count(*) FROM tandem_replicas").fetchone() == (2,)
    await first.close()
    await second.close()
    with psycopg.connect(state_db_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM tandem_replicas").fetchone() == (0,)  # closed: gone
        conn.execute("INSERT INTO tandem_schema VALUES (%s)", (LATEST + 1,))
    with pytest.raises(StateDatabaseError, match="newer tandem"):
        await StateDatabase(state_db_url).open()


async def test_a_dead_replicas_reservations_end_with_its_lease(state_db_url):
    """A replica killed while it holds a reservation: the others see it held until its lease ends,
    then the next heartbeat deletes it (lease 2 s here; the default is 30)."""
    dying = await StateDatabase(state_db_url, lease_s=2.0).open()
    living = await StateDatabase(state_db_url, lease_s=2.0).open()
    held = await ledger_of(dying).reserve([(PAIR, 1.0)], 0.75)
    assert isinstance(held, Reservation)
    dying._heartbeat.cancel()  # what SIGKILL does to its heartbeat: the lease is no longer renewed
    ledger = ledger_of(living)
    assert await ledger.held(PAIR) == 0.75
    assert isinstance(await ledger.reserve([(PAIR, 1.0)], 0.5), Shortfall)

    def rows_left() -> int:
        with psycopg.connect(state_db_url) as conn:
            query = "SELECT count(*) FROM tandem_reservations WHERE replica = %s"
            return conn.execute(query, (dying.replica_id,)).fetchone()[0]

    deadline = time.monotonic() + 10
    while await ledger.held(PAIR) > 0:
        assert time.monotonic() < deadline, "the dead replica's reservation outlived its lease"
        await asyncio.sleep(0.2)
    assert isinstance(await ledger.reserve([(PAIR, 1.0)], 0.5), Reservation)
    # Past the lease it no longer counts (above); the next heartbeat of the living replica deletes the row too.
    while rows_left():
        assert time.monotonic() < deadline, "no heartbeat swept the dead replica's reservation"
        await asyncio.sleep(0.2)
    await living.close()
    await dying._pool.close()


async def test_reservations_across_replicas_never_pass_the_limit(state_db_url):
    """Three replicas, 150 concurrent reservations of 0.01 against a limit of 1.0, each settled at its
    full amount: exactly 100 fit, and the spend ends at the limit, not above."""
    replicas = [await StateDatabase(state_db_url).open() for _ in range(3)]
    ledgers = [ledger_of(db) for db in replicas]

    async def one(i: int) -> bool:
        ledger = ledgers[i % 3]
        held = await ledger.reserve([(PAIR, 1.0)], 0.01)
        if isinstance(held, Shortfall):
            return False
        await asyncio.sleep(0.01)
        ledger.settle(held, [PAIR[0]], 0.01, 1, 1)
        return True

    admitted = await asyncio.gather(*(one(i) for i in range(150)))
    for ledger in ledgers:
        await ledger.settled()
    spend = (await ledgers[0].spends([PAIR]))[PAIR]
    assert sum(admitted) <= 100 and spend.usd <= 1.0 + 1e-9
    assert spend.requests == sum(admitted) and spend.usd == pytest.approx(0.01 * sum(admitted))
    assert sum(admitted) >= 95  # concurrency cost nothing but what was held at the moment
    for db in replicas:
        await db.close()


async def test_away_then_back_without_a_restart(postgres_server, state_db_url):
    """The server stops: decisions raise StateUnavailableError naming the database, settles wait;
    it starts again: the waiting settles are written and decisions resume, no restart."""
    db = await StateDatabase(state_db_url, lease_s=3.0).open()
    ledger = ledger_of(db)
    held = await ledger.reserve([(PAIR, 1.0)], 0.2)
    postgres_server.stop()
    try:
        with pytest.raises(StateUnavailableError, match="the state database is unavailable") as refused:
            await ledger.reserve([(PAIR, 1.0)], 0.2)
        assert "127.0.0.1" not in str(refused.value) and "postgresql://" not in str(refused.value)
        assert not db.available and db.outages == 1 and db.last_error
        ledger.settle(held, [PAIR[0]], 0.1, 1, 1)  # a request that ends during the outage
        assert db.pending_writes >= 0
    finally:
        postgres_server.start()
    deadline = time.monotonic() + 15
    while not db.available:
        assert time.monotonic() < deadline, "the database was not seen back"
        await asyncio.sleep(0.1)
    await ledger.settled()
    spend = (await ledger.spends([PAIR]))[PAIR]
    assert (spend.usd, spend.requests) == (pytest.approx(0.1), 1) and await ledger.held(PAIR) == 0
    await db.close()
