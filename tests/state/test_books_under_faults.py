"""The shared books (sdk.state, sdk.budgets.postgres_ledger, sdk.serving.shared_limits) under the faults a
production day brings, each made real: a reply lost after the database committed (a TCP proxy that cuts the
connection as the answer comes back), a node turned read-only by a failover, a replica cut off from the
database while its budgeted streams run, and deferred writes piling up.

Pinned: a settle whose reply was lost is counted once; a read-only database neither loses a settle nor strands
its reservation (the hold stays while the settle waits, a metric and a log line say so, and both land once
it is writable); a replica that cannot renew its lease ends its budgeted streams while its reservations still
stand, so no other replica can reserve against a limit they still hold; slots in flight go back once however
often their return is sent; the writes queue is bounded and never drops a settle.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import psycopg
import pytest

from router.costs import TierPrices
from sdk.budgets.ledger import Reservation, Shortfall, key_scope, periods
from sdk.budgets.manager import BudgetManager
from sdk.budgets.metered_engine import BudgetedEngine
from sdk.budgets.postgres_ledger import PostgresSpendLedger
from sdk.protocol.engine import Caller, GenerationRequest, SamplingParams, StateUnavailableError
from sdk.serving.shared_limits import SharedInFlightLimiter
from sdk.state.database import StateDatabase
from sdk.state.writes import DeferredWrites
from tests.cloud_engine.grpc_helpers import LONG, engine, long_tiny_dir  # noqa: F401  (fixtures)
from tests.state.db_proxy import DatabaseProxy

NOW = 1_795_000_000.0  # 2026-11-18 UTC: the ledgers' clock
PAIR = ("key:k", periods(NOW)["day"])


def ledger_of(db: StateDatabase) -> PostgresSpendLedger:
    return PostgresSpendLedger(db, clock=lambda: NOW)


async def eventually(condition, timeout_s: float = 15.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        await asyncio.sleep(0.1)


def terminate_sessions(admin_url: str, database: str) -> None:
    """End every session on `database` (what a failover does to the connections of the old primary)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )


async def test_a_settle_whose_reply_is_lost_is_counted_once(postgres_server, state_db_url):
    """The database commits the settle, the reply never comes back (the proxy cuts the connection), the
    writer sends it again: the batch's id is found and nothing is added twice."""
    with DatabaseProxy(postgres_server.port) as proxy:
        db = await StateDatabase(proxy.url_for(state_db_url), lease_s=30.0).open()
        try:
            ledger = ledger_of(db)
            held = await ledger.reserve([(PAIR, 1.0)], 0.5)
            assert isinstance(held, Reservation)
            proxy.lose_reply_to(b"tandem_settle_batch")
            ledger.settle(held, [PAIR[0]], 0.10, 3, 3)
            await eventually(lambda: _landed(db), what="the settle landing after its lost reply")
            assert proxy.num_replies_lost == 1 and ledger.num_batches_replayed == 1
            spend = (await ledger.spends([PAIR]))[PAIR]
            assert (spend.usd, spend.requests, spend.total_tokens) == (pytest.approx(0.10), 1, 3)
            assert await ledger.held(PAIR) == 0
        finally:
            await db.close()


async def _landed(db: StateDatabase) -> bool:
    return db.pending_writes == 0 and db.available


async def test_slots_in_flight_go_back_once_however_often_their_return_is_sent(postgres_server, state_db_url):
    """Returning a slot whose reply is lost, then sending it again, gives back that one slot: the other
    requests of the key keep theirs (schema 4's counter went down once per call)."""
    with DatabaseProxy(postgres_server.port) as proxy:
        db = await StateDatabase(proxy.url_for(state_db_url), lease_s=30.0).open()
        try:
            limiter = SharedInFlightLimiter(db, max_in_flight=3)
            assert [await limiter.try_acquire("key-a") for _ in range(4)] == [True, True, True, False]
            proxy.lose_reply_to(b"tandem_in_flight_requests")
            limiter.release("key-a")
            await eventually(lambda: _landed(db), what="the slot's return")
            assert proxy.num_replies_lost == 1
            assert await limiter.in_flight_everywhere("key-a") == 2  # one slot back, not two
            assert await limiter.try_acquire("key-a") and not await limiter.try_acquire("key-a")
        finally:
            await db.close()


async def test_a_read_only_database_neither_loses_spend_nor_strands_a_hold(postgres_server, state_db_url, caplog):
    """A failover leaves the replica on a read-only node: the settle fails there and waits (it was dropped
    before: spend lost, the hold stranded for the rest of the period), its reservation keeps holding, a
    metric and a log line say what waits and for how long; once writable, both land."""
    caplog.set_level(logging.WARNING, logger="tandem.state")
    database = state_db_url.rsplit("/", 1)[1]
    admin = postgres_server.url
    db = await StateDatabase(state_db_url, lease_s=30.0).open()
    try:
        ledger = ledger_of(db)
        held = await ledger.reserve([(PAIR, 1.0)], 0.5)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        terminate_sessions(admin, database)
        ledger.settle(held, [PAIR[0]], 0.10, 2, 2)
        await asyncio.sleep(2.5)  # several tries, each refused by the read-only node
        assert ledger.pending_settles == 1 and db.writes.num_retries >= 2 and db.writes.oldest_age_s >= 2.0
        assert "state database writes wait" in caplog.text
        with psycopg.connect(state_db_url) as reader:  # reads work on a read-only node: the hold stands
            assert reader.execute("SELECT coalesce(sum(usd), 0) FROM tandem_reservations").fetchone()[0] == 0.5
            assert reader.execute("SELECT count(*) FROM tandem_spend").fetchone()[0] == 0
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = off")
        terminate_sessions(admin, database)
        await eventually(lambda: _landed(db), what="the settle landing once the database is writable")
        spend = (await ledger.spends([PAIR]))[PAIR]
        assert (spend.usd, spend.requests) == (pytest.approx(0.10), 1) and await ledger.held(PAIR) == 0
        assert ledger.pending_settles == 0
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = off")
        await db.close()


LEASE_S = 2.0
KEY_ID = "f" * 64
LIMIT_USD, REQUEST_USD = 1.0, 0.9
# A request of LONG tokens reserves REQUEST_USD: 0.9 of a 1.00 USD day, so two of them cannot both be held.
PRICES = TierPrices(input_per_million=0.0, output_per_million=REQUEST_USD / LONG * 1e6)


async def test_a_cut_off_replica_ends_its_budgeted_streams_before_its_reservations_are_swept(
    engine,  # noqa: F811
    postgres_server,
    state_db_url,
    tmp_path,
):
    """Two replicas, a 1.00 USD day, requests of 0.90: the first replica's connection to the database goes
    silent mid-stream. Before the fence, its stream ran on after the second replica swept its reservation and
    took a 0.90 of its own (1.80 spent). Now the stream ends while the reservation still stands (the second
    replica is refused then), and the day passes the limit by what the cut-off stream had spent, no more."""
    (tmp_path / "budgets.toml").write_text(f"[default]\nusd_per_day = {LIMIT_USD}\n")
    with DatabaseProxy(postgres_server.port) as proxy:
        cut_off = await StateDatabase(proxy.url_for(state_db_url), lease_s=LEASE_S).open()
        other = await StateDatabase(state_db_url, lease_s=LEASE_S).open()
        try:
            budgets = BudgetManager(
                str(tmp_path / "budgets.toml"), PostgresSpendLedger(cut_off), False, cloud_only=True
            )
            others = BudgetManager(str(tmp_path / "budgets.toml"), PostgresSpendLedger(other), False, cloud_only=True)
            billed = BudgetedEngine(engine, budgets, PRICES)
            request = GenerationRequest(
                f"cut-off-{uuid.uuid4().hex[:8]}",
                [1, 2, 3],
                SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True),
                caller=Caller(KEY_ID),
            )
            num_events, ended_at, ended_with = 0, None, None
            try:
                async for _ in billed.generate(request):
                    num_events += 1
                    if num_events == 5:
                        proxy.freeze()
                        frozen_at = time.monotonic()
                    await asyncio.sleep(0.02)  # a client reading at 50 tokens a second: LONG would take 20 s
            except StateUnavailableError as exc:
                ended_at, ended_with = time.monotonic(), exc
            assert ended_with is not None, "the stream of a cut-off replica ran to its end"
            assert ended_at - frozen_at < LEASE_S, "the stream ended only after the lease"
            # At that moment the reservation still stands: the other replica cannot take a 0.90 of its own.
            _, breach = await others.reserve(KEY_ID, None, REQUEST_USD)
            assert breach is not None, "the cut-off replica's reservation was gone before its stream ended"
            reservation = None
            while reservation is None:  # the lease lapses, the sweep deletes it: now the other reserves
                assert time.monotonic() - frozen_at < 15, "the cut-off replica's reservation was never swept"
                await asyncio.sleep(0.1)
                reservation, _ = await others.reserve(KEY_ID, None, REQUEST_USD)
            others.settle(reservation, KEY_ID, None, REQUEST_USD, LONG, LONG)
            proxy.thaw()
            ledger = budgets.ledger
            await eventually(lambda: _landed(cut_off), timeout_s=20, what="the cut-off replica's settle")
            await other.flush()
            spent_by_cut_off = PRICES.cost(0, num_events)
            day = (await ledger.current(key_scope(KEY_ID), "day")).usd
            # What the cut-off stream spent before its fence is the overrun, and it is less than its reservation.
            assert day == pytest.approx(REQUEST_USD + spent_by_cut_off, abs=PRICES.cost(0, 2))
            assert spent_by_cut_off < REQUEST_USD
            assert "state database" in str(ended_with) and "127.0.0.1" not in str(ended_with)
        finally:
            await cut_off.close()
            await other.close()


async def test_deferred_writes_are_bounded_and_never_drop_a_settle(state_db):
    """Past state_db_max_pending_writes, droppable writes (stored responses) are dropped, settles are not,
    and the ledger refuses new budgeted work (fails closed) until the queue drains."""
    writes = DeferredWrites(max_pending=2).start()
    landed = []
    gate = asyncio.Event()

    def write(name: str):
        async def run() -> None:
            await gate.wait()
            landed.append(name)

        return run

    assert writes.defer(write("settle-1")) and writes.defer(write("settle-2"))
    assert writes.backed_up and not writes.defer(write("response"), droppable=True)
    assert writes.defer(write("settle-3"))  # a settle always goes in
    gate.set()
    await writes.flush(5)
    assert landed == ["settle-1", "settle-2", "settle-3"] and writes.num_dropped == 1
    await writes.close()

    ledger = ledger_of(state_db)
    state_db.writes.max_pending = 1
    state_db.writes.defer(write("blocked"))  # gate is set: it lands at once, so hold the queue with a slow one
    stuck = asyncio.Event()

    async def slow() -> None:
        await stuck.wait()

    state_db.writes.defer(slow)
    with pytest.raises(StateUnavailableError):
        await ledger.reserve([(PAIR, 1.0)], 0.1)
    assert isinstance(await ledger.reserve([], 0.1), Reservation)  # nothing to hold: not refused
    stuck.set()
    await state_db.flush(5)
    assert isinstance(await ledger.reserve([(PAIR, 1.0)], 0.1), Reservation | Shortfall)
