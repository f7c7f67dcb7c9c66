"""The state database frozen (SIGSTOP on the server and its backends: connections stay open, the kernel takes
the bytes, nothing answers), under `tandem cloud serve`'s hosted API as the CLI builds it: budgets in the
shared ledger, the client limits in the database, the admin routes.

Pinned: a budgeted request fails closed within 2 s of the database going silent (503
state_database_unavailable, Retry-After, a reference and no address); a request without a budget is served,
its limits falling back to this replica's own; /health says only "unreachable" while /admin/status has the
details; nothing that reaches a caller (the HTTP body, the gRPC status) names the database. Once the server
runs again, budgeted requests are served again. Before the deadlines, an admit waited 15 s and more here.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.postgres_server import ThrowawayPostgres, postgres_unavailable
from router.costs import TierPrices
from sdk.budgets.manager import BudgetManager
from sdk.budgets.metered_engine import BudgetedEngine
from sdk.budgets.postgres_ledger import PostgresSpendLedger
from tests.app_helpers import make_app
from sdk.openai_server.drain import DrainableEngine, admin_routes
from sdk.serving.api_keys import key_fingerprint
from sdk.serving.grpc.errors import status_for
from sdk.serving.shared_limits import shared_client_limits
from sdk.state.database import StateDatabase
from tests.budgets.test_hosted_budgets import client
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir  # noqa: F401  (fixtures)

KEY, FREE, ADMIN = "sk-frozen-budgeted-0123456789", "sk-frozen-free-0123456789", "sk-frozen-admin-0123456789"
PRICES = TierPrices(input_per_million=1.0, output_per_million=2.0)
ASK = {"model": "tiny", "prompt": "a frozen database", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
DEADLINE_S = 1.5  # state_db_timeout_s's default: admission waits at most this on the database


@pytest.fixture
def own_postgres():
    """A server of this test's own: SIGSTOP must not freeze the session's shared one."""
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    server = ThrowawayPostgres().start()
    try:
        yield server
    finally:
        if server.running:
            server.resume()
        server.close()


async def test_a_frozen_database_fails_budgeted_requests_closed_and_serves_the_rest(
    engine,  # noqa: F811
    own_postgres,
    tmp_path,
):
    (tmp_path / "budgets.toml").write_text(f"[default]\nusd_per_day = 100.0\n\n[keys.{key_fingerprint(FREE)}]\n")
    db = await StateDatabase(own_postgres.new_database(), lease_s=30.0, timeout_s=DEADLINE_S).open()
    try:
        budgets = BudgetManager(str(tmp_path / "budgets.toml"), PostgresSpendLedger(db), False, cloud_only=True)
        served = DrainableEngine(BudgetedEngine(engine, budgets, PRICES))
        limits = shared_client_limits(db, rate_limit_per_minute=600, max_concurrent_per_key=8, auth_backoff_after=10)
        app = make_app(served, budgets=budgets, client_limits=limits, state_db=db, api_keys={KEY, FREE})
        admin_routes(app, served, ADMIN)
        async with client(app, KEY) as budgeted, client(app, FREE) as free, client(app, ADMIN) as admin:
            assert (await budgeted.post("/v1/completions", json=ASK)).status_code == 200
            own_postgres.pause()
            started = time.monotonic()
            refused = await budgeted.post("/v1/completions", json=ASK)
            waited = time.monotonic() - started
            assert refused.status_code == 503, refused.text
            assert waited < 2.0, f"a budgeted request waited {waited:.1f} s on a frozen database"
            error = refused.json()["error"]
            assert error["code"] == "state_database_unavailable" and "reference" in error["message"]
            assert refused.headers["retry-after"]
            for secret in ("127.0.0.1", str(own_postgres.port), "postgresql://", "postgres@"):
                assert secret not in refused.text
            started = time.monotonic()
            answered = await free.post("/v1/completions", json=ASK)  # no budget: served on this replica's limits
            assert answered.status_code == 200, answered.text
            assert time.monotonic() - started < 2.0 + 5.0  # the generation itself, after no wait on the database
            assert (await budgeted.get("/health")).json() == {"status": "ok", "state_db": "unreachable"}
            details = (await admin.get("/admin/status")).json()["state_db"]
            assert details["available"] is False and details["last_error"] and "***" not in details["where"]
            grpc_status = status_for(db.unavailable())  # what the gRPC door sends for the same failure
            assert grpc_status.code.name == "UNAVAILABLE" and "127.0.0.1" not in grpc_status.message
            own_postgres.resume()
            deadline = time.monotonic() + 30
            while (reply := await budgeted.post("/v1/completions", json=ASK)).status_code == 503:
                assert time.monotonic() < deadline, f"serving did not resume: {reply.text}"
                await asyncio.sleep(0.2)
            assert reply.status_code == 200, reply.text
    finally:
        own_postgres.resume()
        await db.close()
