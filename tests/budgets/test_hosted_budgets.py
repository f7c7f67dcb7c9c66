"""Budgets on `tandem cloud serve`'s hosted API: the tiny cloud engine behind sdk.budgets'
BudgetedEngine, served over HTTP (the OpenAI API) and gRPC at once, as the CLI serves it.

Pinned: 200 concurrent requests against a budget that allows 50 are held to 50 (each request's
reservation is its largest cost; with ignore_eos it is also its real cost, so the bound is
exact), the ledger equals what the responses' usage costs at the prices (no drift), n=2 bills
the prompt once as usage counts it, a client that leaves mid-stream is billed what was computed
and holds nothing after, the soft warning header, per-user limits, a key's spend shared by both
listeners, the gRPC refusal the SDK's client reads as CloudQuotaExceededError, and cloud-share
limits refused on a cloud-only server.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from router.costs import TierPrices
from sdk.budgets.config import BudgetConfigError
from sdk.budgets.ledger import key_scope, user_scope
from sdk.budgets.manager import BudgetManager, check_budgets
from sdk.budgets.metered_engine import BudgetedEngine
from sdk.cloud.grpc_client import CloudClient, CloudQuotaExceededError
from tests.app_helpers import make_app
from sdk.serving.api_keys import key_fingerprint
from sdk.protocol.engine import Caller, GenerationRequest, SamplingParams
from tests.budgets.conftest import kept_spend
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, serve, wait_drained  # noqa: F401  (fixtures)

KEY, OTHER = "sk-hosted-key-0123456789", "sk-hosted-other-0123456789"
PRICES = TierPrices(input_per_million=1000.0, output_per_million=2000.0)
MAX_TOKENS = 4
ASK = {
    "model": "tiny",
    "prompt": "The budget of this request",
    "max_tokens": MAX_TOKENS,
    "temperature": 0,
    "ignore_eos": True,
}


def hosted(engine, tmp_path, budgets_text: str, ledger):  # noqa: F811
    (tmp_path / "budgets.toml").write_text(budgets_text)
    budgets = BudgetManager(str(tmp_path / "budgets.toml"), ledger, prices_are_zero=False, cloud_only=True)
    billed = BudgetedEngine(engine, budgets, PRICES)
    return billed, make_app(billed, budgets=budgets, api_keys={KEY, OTHER}), ledger


def client(app, key: str = KEY) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        timeout=300,
        headers={"Authorization": f"Bearer {key}"},
    )


def usage_cost(usage: dict) -> float:
    return PRICES.cost(usage["prompt_tokens"], usage["completion_tokens"])


async def spent(ledger, scope: str) -> float:
    """What `scope` spent today, once the settles made so far are in."""
    await ledger.settled()
    return (await ledger.current(scope, "day")).usd


def request_cost(engine) -> float:  # noqa: F811
    return PRICES.cost(len(engine.tokenize(ASK["prompt"])), MAX_TOKENS)


async def test_200_concurrent_requests_against_a_budget_for_50(engine, tmp_path, open_ledger):  # noqa: F811
    cost = request_cost(engine)
    billed, app, ledger = hosted(engine, tmp_path, f"[default]\nusd_per_day = {50.5 * cost!r}\n", open_ledger())
    async with client(app) as http:
        replies = await asyncio.gather(*(http.post("/v1/completions", json=ASK) for _ in range(200)))
        ok = [r.json() for r in replies if r.status_code == 200]
        refused = [r for r in replies if r.status_code == 429]
        assert len(ok) + len(refused) == 200
        assert len(ok) == 50  # each holds its largest cost, which with ignore_eos is its real cost: exactly 50 fit
        total = sum(usage_cost(r["usage"]) for r in ok)
        assert total == pytest.approx(50 * cost) and total <= 50.5 * cost
        error = refused[0].json()["error"]
        assert (error["type"], error["code"]) == (
            "insufficient_quota",
            "insufficient_quota",
        ) and "usd_per_day" in error["message"]
        assert refused[0].headers["x-should-retry"] == "false"
        await ledger.settled()  # the state database's settles are written just after each answer
        status = (await http.get("/v1/budget")).json()
        [limit] = status["scopes"][0]["limits"]
        assert limit["spent"] == pytest.approx(total) and limit["requests"] == 50
        async with client(app, OTHER) as other:  # another key has its own budget
            assert (await other.post("/v1/completions", json=ASK)).status_code == 200
    await ledger.settled()
    assert await ledger.held_anywhere() == 0  # every reservation released
    kept = await kept_spend(ledger, key_scope(key_fingerprint(KEY)))
    assert kept == pytest.approx(total, rel=1e-12)  # no drift


async def test_the_bill_follows_usage_for_n_choices_and_streams(engine, tmp_path, open_ledger):  # noqa: F811
    billed, app, ledger = hosted(engine, tmp_path, "[default]\nusd_per_day = 100.0\n", open_ledger())
    scope = key_scope(key_fingerprint(KEY))
    async with client(app) as http:
        two = (await http.post("/v1/completions", json={**ASK, "n": 2})).json()
        assert two["usage"]["completion_tokens"] == 2 * MAX_TOKENS  # the prompt is counted once
        assert await spent(ledger, scope) == pytest.approx(usage_cost(two["usage"]))
        before = await spent(ledger, scope)
        async with http.stream(
            "POST", "/v1/completions", json={**ASK, "stream": True, "stream_options": {"include_usage": True}}
        ) as r:
            body = [line async for line in r.aiter_lines() if line.startswith("data: {")]
        usage = httpx.Response(200, content=body[-1][6:]).json()["usage"]
        assert await spent(ledger, scope) - before == pytest.approx(usage_cost(usage))
    # A caller that leaves mid-stream (the server closes the engine's stream, as on a disconnect):
    # billed what the engine computed, and nothing stays held.
    before = await spent(ledger, scope)
    request = GenerationRequest(
        "left-early",
        engine.tokenize(ASK["prompt"]),
        SamplingParams(max_tokens=500, ignore_eos=True),
        caller=Caller(key_fingerprint(KEY)),
    )
    events = billed.generate(request)
    seen = [await anext(events) for _ in range(3)]
    assert await ledger.held_anywhere() > 0  # the largest cost (500 tokens) is held while it runs
    await events.aclose()
    assert await wait_drained(engine)
    await ledger.settled()
    assert await ledger.held_anywhere() == 0
    prompt = len(engine.tokenize(ASK["prompt"]))
    assert await spent(ledger, scope) - before == pytest.approx(PRICES.cost(prompt, seen[-1].num_output_tokens or 3))


async def test_soft_warning_and_per_user_limits(engine, tmp_path, open_ledger):  # noqa: F811
    cost = request_cost(engine)
    text = f"[default]\nsoft_usd_per_day = {0.5 * cost!r}\n\n[per_user]\nusd_per_day = {1.5 * cost!r}\n"
    billed, app, ledger = hosted(engine, tmp_path, text, open_ledger())
    async with client(app) as http:
        first = await http.post("/v1/completions", json={**ASK, "user": "ana"})
        assert first.status_code == 200 and "x-tandem-budget-warning" not in first.headers
        assert "ignored_fields" not in (first.json().get("tandem") or {})  # `user` is billed here, not ignored
        second = await http.post("/v1/completions", json={**ASK, "user": "bo"})
        assert "soft_usd_per_day" in second.headers["x-tandem-budget-warning"]  # the key's soft limit, reached by ana
        assert (await http.post("/v1/completions", json={**ASK, "user": "ana"})).status_code == 429  # ana's own limit
        assert (await http.post("/v1/completions", json={**ASK, "user": "cy"})).status_code == 200  # a user of its own
        status = (await http.get("/v1/budget", params={"user": "ana"})).json()
        assert [scope["scope"] for scope in status["scopes"]] == ["key", "user"]
    assert await spent(ledger, user_scope(key_fingerprint(KEY), "ana")) == pytest.approx(cost)
    assert billed.budgets.counts.soft_warnings >= 1 and billed.budgets.counts.refused == 1


async def test_grpc_and_http_share_a_keys_budget(engine, tmp_path, serve, open_ledger):  # noqa: F811
    cost = request_cost(engine)
    billed, app, ledger = hosted(engine, tmp_path, f"[default]\nusd_per_day = {2.5 * cost!r}\n", open_ledger())
    target = await serve(billed, api_keys=frozenset({KEY, OTHER}))
    grpc_client = CloudClient(target, api_key=KEY)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    try:
        async with client(app) as http:
            assert (await http.post("/v1/completions", json=ASK)).status_code == 200  # HTTP spends one
            events = [e async for e in grpc_client.generate(engine.tokenize(ASK["prompt"]), params, model="tiny")]
            assert events[-1].finish_reason == "length"  # gRPC spends the second
            with pytest.raises(CloudQuotaExceededError, match="usd_per_day"):  # the third does not fit, whichever door
                [e async for e in grpc_client.generate(engine.tokenize(ASK["prompt"]), params, model="tiny")]
            assert (await http.post("/v1/completions", json=ASK)).status_code == 429
    finally:
        await grpc_client.close()
    assert await spent(ledger, key_scope(key_fingerprint(KEY))) == pytest.approx(2 * cost)


def test_a_cloud_only_server_refuses_cloud_share_limits(tmp_path):
    path = tmp_path / "budgets.toml"
    path.write_text("[per_user]\ncloud_share_per_day = 0.5\n")
    with pytest.raises(BudgetConfigError, match=r"\[per_user\] sets cloud_share_per_day.*always 1"):
        check_budgets(str(path), prices_are_zero=False, cloud_only=True)
    check_budgets(str(path), prices_are_zero=False)  # tandem serve's cascade applies them


def test_tandem_cloud_serve_checks_its_budgets_before_loading_anything(tmp_path):
    from typer.testing import CliRunner

    from sdk.cli.app import app

    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[default]\nusd_per_day = 1.0\n")
    result = CliRunner().invoke(app, ["cloud", "serve", "--budgets-file", str(budgets)])
    assert result.exit_code != 0 and "prices are 0" in result.output and "--price-input-per-million" in result.output
    budgets.write_text("[default]\ncloud_share_per_month = 0.5\n")
    result = CliRunner().invoke(
        app, ["cloud", "serve", "--budgets-file", str(budgets), "--price-input-per-million", "1"]
    )
    assert result.exit_code != 0 and "cloud_share_per_month" in result.output
