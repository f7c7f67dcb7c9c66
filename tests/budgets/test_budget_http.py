"""Budgets through the server (tandem serve's app over the real cascade: SmolLM2 on the device,
the tiny cloud engine over gRPC, two API keys): the spend stays within a hard budget under 200
concurrent requests, over it `cloud` is a 429 OpenAI clients do not retry and `auto` answers
locally, per-user budgets, the soft warning, GET /v1/budget, and no drift between what the
responses say they cost and what the ledger kept."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from sdk.budgets.ledger import SpendLedger, key_scope
from sdk.budgets.manager import BudgetManager
from tests.app_helpers import make_app
from sdk.serving.api_keys import key_fingerprint
from tests.budgets.conftest import kept_spend
from tests.cloud_engine.grpc_helpers import long_tiny_dir, serve  # noqa: F401  (fixtures)
from tests.sdk.test_cascade import cloud_engine, local_engine, make_runner, recording  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

KEY, OTHER = "sk-budget-key-0123456789", "sk-budget-other-0123456789"
PRICES = {"cloud": {"input_per_million": 1000.0, "output_per_million": 2000.0}}
ASK = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": True}


async def app_with_budgets(make_runner, tmp_path, budgets_text: str, ledger=None):  # noqa: F811
    (tmp_path / "budgets.toml").write_text(budgets_text)
    ledger = ledger or SpendLedger(tmp_path / "spend.sqlite3").start()
    budgets = BudgetManager(str(tmp_path / "budgets.toml"), ledger, prices_are_zero=False)
    runner = await make_runner(prices=PRICES, budgets=budgets)
    app = make_app(runner.local, cascade=runner, budgets=budgets, api_keys={KEY, OTHER})
    return runner, ledger, app


def client(app, key: str = KEY) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        timeout=300,
        headers={"Authorization": f"Bearer {key}"},
    )


async def test_spend_stays_within_the_budget_under_200_concurrent_requests(
    make_runner,  # noqa: F811
    tmp_path,
    open_ledger,
):
    runner, ledger, app = await app_with_budgets(make_runner, tmp_path, "[default]\nusd_per_day = 0.5\n", open_ledger())
    async with client(app) as http:
        replies = await asyncio.gather(
            *(http.post("/v1/chat/completions", json={"model": "cloud", **ASK}) for _ in range(200))
        )
        statuses = [r.status_code for r in replies]
        ok = [r.json() for r in replies if r.status_code == 200]
        refused = [r for r in replies if r.status_code == 429]
        assert set(statuses) <= {200, 429} and ok and refused, statuses
        cost = ok[0]["tandem"]["cost"]["total_cost_usd"]
        assert cost > 0 and all(r["tandem"]["tier"] == "cloud" for r in ok)
        spent = sum(r["tandem"]["cost"]["total_cost_usd"] for r in ok)
        assert spent <= 0.5 + 1e-9  # the documented bound: reservations keep concurrent calls inside the budget
        error = refused[0].json()["error"]
        assert (error["type"], error["code"]) == (
            "insufficient_quota",
            "insufficient_quota",
        ) and "usd_per_day" in error["message"]
        assert refused[0].headers["x-should-retry"] == "false"
        # Sequentially, the rest of the budget is used up to what fits, then every cloud call is refused:
        # what is left is less than one request's largest cost (its reservation; the message says it).
        await ledger.settled()  # another replica's settles would be in too: the database is one
        while (last := await http.post("/v1/chat/completions", json={"model": "cloud", **ASK})).status_code == 200:
            spent += cost
            await ledger.settled()
        wanted = float(re.search(r"largest cloud cost \(([0-9.]+) USD", last.json()["error"]["message"]).group(1))
        assert cost <= wanted and 0.5 - spent < wanted and spent <= 0.5 + 1e-9
        # auto answers on the device instead, marked degraded.
        local = (await http.post("/v1/chat/completions", json={"model": "auto:1", **ASK})).json()
        assert (local["tandem"]["tier"], local["tandem"]["degraded_reason"]) == ("local", "budget_exhausted")
        # Another key has its own budget.
        async with client(app, OTHER) as other:
            assert (await other.post("/v1/chat/completions", json={"model": "cloud", **ASK})).status_code == 200
        await ledger.settled()
        status = (await http.get("/v1/budget")).json()
        [limit] = status["scopes"][0]["limits"]
        assert status["key_fingerprint"] == key_fingerprint(KEY) and limit["limit"] == "usd_per_day"
        assert limit["exhausted"] is False and limit["spent"] == pytest.approx(spent) and limit["remaining"] < wanted
    kept = await kept_spend(ledger, key_scope(key_fingerprint(KEY)))
    assert kept == pytest.approx(spent, abs=1e-9)  # no drift


async def test_per_user_budgets_and_the_soft_warning(make_runner, tmp_path):  # noqa: F811
    text = "[default]\nsoft_usd_per_day = 0.0001\n[per_user]\nusd_per_day = 0.05\n"
    runner, ledger, app = await app_with_budgets(make_runner, tmp_path, text)
    async with client(app) as http:
        first = await http.post("/v1/chat/completions", json={"model": "cloud", "user": "alice", **ASK})
        assert first.status_code == 200 and "x-tandem-budget-warning" not in first.headers
        codes = []
        for _ in range(30):
            reply = await http.post("/v1/chat/completions", json={"model": "cloud", "user": "alice", **ASK})
            codes.append(reply.status_code)
            if reply.status_code == 429:
                assert "user budget usd_per_day" in reply.json()["error"]["message"]
                break
        assert codes[-1] == 429
        bob = await http.post("/v1/chat/completions", json={"model": "cloud", "user": "bob", **ASK})
        assert bob.status_code == 200 and "soft_usd_per_day" in bob.headers["x-tandem-budget-warning"]
        alice = (await http.get("/v1/budget", params={"user": "alice"})).json()
        assert [s["scope"] for s in alice["scopes"]] == ["key", "user"] and alice["user"] == "alice"
        metrics = (await http.get("/metrics")).text
        assert 'tandem:budget_requests_total{outcome="refused"} 1.0' in metrics
        assert 'tandem:budget_requests_total{outcome="warned"}' in metrics
    ledger.close()


async def test_a_cascade_whose_cloud_key_is_out_of_budget_answers_locally(
    make_runner,  # noqa: F811
    recording,  # noqa: F811
    serve,  # noqa: F811
    tmp_path,
):
    """The hosted side's budget (tandem cloud serve with --budgets-file) seen from a cascade: its cloud
    key's 429-equivalent (gRPC RESOURCE_EXHAUSTED insufficient_quota) keeps the answer local with its
    own reason, and the breaker counts nothing (the tier is healthy; another key may still use it)."""
    from router.costs import TierPrices
    from sdk.budgets.metered_engine import BudgetedEngine
    from tests.sdk.test_cascade import GREEDY, QUESTION

    (tmp_path / "budgets.toml").write_text("[default]\nusd_per_day = 0.000001\n")
    ledger = SpendLedger(tmp_path / "spend.sqlite3").start()
    budgets = BudgetManager(str(tmp_path / "budgets.toml"), ledger, prices_are_zero=False, cloud_only=True)
    runner = await make_runner(await serve(BudgetedEngine(recording, budgets, TierPrices(1000.0, 2000.0))))
    for _ in range(3):
        result = await runner.complete(QUESTION, GREEDY, model="auto:1")
        assert (result.routing.tier, result.routing.degraded_reason) == ("local", "cloud_quota_exhausted")
    assert runner.breaker.state.value == "closed" and runner.breaker.num_consecutive_failures == 0
    assert budgets.counts.refused == 3 and recording.received  # the cloud saw the requests and refused them
    ledger.close()
