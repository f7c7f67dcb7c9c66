"""API keys, rate limits and the bounded queue of the OpenAI server, over the tiny cloud engine."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import openai
import pytest

from cloud_engine.async_engine import AsyncCloudEngine
from cloud_engine.config import CloudEngineConfig
from sdk.serving.api_keys import key_fingerprint, loggable_id
from sdk.protocol.engine import GenerationRequest, SamplingParams
from sdk.cascade.runner import CascadeRunner
from sdk.openai_server import AppConfig, AppServices, warn_if_exposed
from tests.app_helpers import make_app
from sdk.settings import load_settings
from sdk.openai_server.drain import DrainableEngine, admin_routes
from tests.cloud_engine.test_cloud_engine_edges import tiny_dir  # noqa: F401  (fixture)
from tests.sdk.test_openai_server import FakeEngine

KEY, OTHER_KEY, WRONG_KEY = "sk-tandem-good-0123456789", "sk-tandem-other-0123456789", "sk-tandem-wrong-0123456789"
ADMIN_KEY = "admin-key-0123456789abcdef"
COMPLETION = {"model": "tiny", "prompt": "w5 w6 w7", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def engine(tiny_dir):  # noqa: F811
    # One request in flight at most (one running, none waiting): the next one finds the queue full.
    config = CloudEngineConfig(
        model=tiny_dir,
        model_name="tiny",
        block_size=4,
        kv_cache_gb=0.001,
        max_model_len=64,
        max_num_seqs=1,
        max_waiting=0,
    )
    engine = AsyncCloudEngine(config).start()
    engine.wait_ready(60)
    yield engine
    engine.shutdown()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def http(app, key: str | None = None, client_ip: str = "127.0.0.1") -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=app, client=(client_ip, 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers)


def rejections(metrics_text: str, reason: str) -> float:
    match = re.search(rf'^tandem:http_rejections_total{{reason="{reason}"}} (\S+)$', metrics_text, re.M)
    assert match, f"no {reason} rejections sample in /metrics"
    return float(match.group(1))


def assert_openai_error(response: httpx.Response, status: int, type_: str, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["type"] == type_ and error["code"] == code and error["param"] is None and error["message"]
    return error


async def test_keys_guard_the_api_and_metrics_but_not_health(engine, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    app = make_app(engine, api_keys=frozenset({KEY, OTHER_KEY}))
    async with http(app) as anonymous, http(app, WRONG_KEY, client_ip="127.0.0.2") as wrong, http(app, KEY) as good:
        missing = await anonymous.get("/v1/models")
        assert (
            "didn't provide an API key"
            in assert_openai_error(missing, 401, "invalid_request_error", "invalid_api_key")["message"]
        )
        assert missing.headers["www-authenticate"] == "Bearer"
        refused = await wrong.post("/v1/completions", json=COMPLETION)
        assert_openai_error(refused, 401, "invalid_request_error", "invalid_api_key")
        assert WRONG_KEY not in refused.text
        basic = await anonymous.get("/v1/models", headers={"Authorization": f"Basic {KEY}"})
        assert basic.status_code == 401
        assert (await anonymous.get("/metrics")).status_code == 401
        assert (await anonymous.get("/health")).json() == {"status": "ok"}

        assert (await good.get("/v1/models")).json()["data"][0]["id"] == "tiny"
        completion = await good.post("/v1/completions", json=COMPLETION)
        assert completion.status_code == 200 and completion.json()["usage"]["prompt_tokens"] == 3
        assert (
            await good.post("/v1/completions", json=COMPLETION, headers={"Authorization": f"Bearer {OTHER_KEY}"})
        ).status_code == 200
        metrics = await good.get("/metrics")
        assert metrics.status_code == 200 and rejections(metrics.text, "unauthenticated") == 4
        assert rejections(metrics.text, "rate_limited") == 0 and rejections(metrics.text, "overloaded") == 0
    logged = caplog.text
    # Creation lists the keys' ids, a refusal the wrong key's: by their 16-digit prefix, never the whole id.
    assert loggable_id(key_fingerprint(WRONG_KEY)) in logged and loggable_id(key_fingerprint(KEY)) in logged
    assert len(loggable_id(key_fingerprint(KEY))) == 16 and key_fingerprint(KEY) not in logged
    assert all(secret not in logged for secret in (KEY, OTHER_KEY, WRONG_KEY))


async def test_without_keys_or_limits_everything_stays_open(engine):
    async with http(make_app(engine)) as anonymous:
        assert (await anonymous.post("/v1/completions", json=COMPLETION)).status_code == 200
        metrics = await anonymous.get("/metrics")
        assert metrics.status_code == 200 and rejections(metrics.text, "unauthenticated") == 0


async def test_rate_limit_is_per_key_with_retry_after_and_recovers(engine):
    clock = FakeClock()
    app = make_app(
        engine, api_keys=frozenset({KEY, OTHER_KEY}), rate_limit_per_minute=30, rate_limit_burst=2, clock=clock
    )
    async with http(app, KEY) as first, http(app, OTHER_KEY) as second, http(app, WRONG_KEY) as wrong:
        assert (await wrong.get("/v1/models")).status_code == 401  # refused before it can spend a bucket
        assert [(await first.get("/v1/models")).status_code for _ in range(2)] == [200, 200]
        throttled = await first.post("/v1/completions", json=COMPLETION)
        error = assert_openai_error(throttled, 429, "requests", "rate_limit_exceeded")
        assert throttled.headers["retry-after"] == "2" and "try again in 2s" in error["message"]  # 30/min: 2 s a token
        assert (await second.get("/v1/models")).status_code == 200  # another key is not throttled
        assert (await first.get("/metrics")).status_code == 200  # scrapes neither spend nor hit the limit
        clock.now += 1.0
        assert (await first.get("/v1/models")).headers["retry-after"] == "1"
        clock.now += 1.0
        assert (await first.get("/v1/models")).status_code == 200
        assert rejections((await first.get("/metrics")).text, "rate_limited") == 2


async def test_a_brute_force_loop_is_slowed_to_the_backoff_rate(engine, caplog):
    # A guessing loop on a fake clock: each refused request takes 10 ms of "time". Without the
    # backoff all 2,000 guesses would be checked; with it, 5 free ones, then one per doubling wait.
    caplog.set_level(logging.INFO, logger="sdk")
    clock = FakeClock()
    app = make_app(engine, api_keys=frozenset({KEY}), clock=clock, auth_backoff_after=5, auth_backoff_max_s=8)
    checked, backed_off = 0, 0
    async with http(app, client_ip="10.0.0.9") as guesser, http(app, KEY, client_ip="10.0.0.10") as neighbour:
        for guess in range(2000):  # 20 s of guessing
            reply = await guesser.get("/v1/models", headers={"Authorization": f"Bearer sk-guess-{guess}"})
            if reply.status_code == 401:
                checked += 1
            else:
                error = assert_openai_error(reply, 429, "requests", "auth_backoff")
                assert int(reply.headers["retry-after"]) >= 1 and "not checked" in error["message"]
                backed_off += 1
            clock.now += 0.01
        # The waits after the 5 free guesses: 1, 2, 4, 8, 8 s (20 s in all): 5 more checked.
        assert checked <= 5 + 5 and checked + backed_off == 2000
        right = await guesser.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert right.status_code == 429  # even the right key waits: it is not checked while backing off
        assert (await neighbour.get("/v1/models")).status_code == 200  # another address is not affected
        metrics = await neighbour.get("/metrics")
        assert rejections(metrics.text, "auth_backoff") == backed_off + 1
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 2, lines  # one per address and kind: the repeats wait for the next minute
    assert "sk-guess" not in caplog.text


async def test_without_keys_the_limit_is_per_client_address(engine):
    app = make_app(engine, rate_limit_per_minute=1, clock=FakeClock())
    async with http(app, client_ip="10.0.0.1") as one, http(app, client_ip="10.0.0.2") as two:
        assert (await one.get("/v1/models")).status_code == 200
        throttled = await one.get("/v1/models")
        assert throttled.status_code == 429 and throttled.headers["retry-after"] == "60"
        assert (await two.get("/v1/models")).status_code == 200
        assert (await one.get("/health")).status_code == 200


async def test_official_client_raises_authentication_and_rate_limit_errors(engine):
    app = make_app(engine, api_keys=frozenset({KEY}), rate_limit_per_minute=60, rate_limit_burst=1, clock=FakeClock())

    def client(key: str) -> openai.AsyncOpenAI:
        transport = httpx.ASGITransport(app=app)
        return openai.AsyncOpenAI(
            base_url="http://test/v1", api_key=key, max_retries=0, http_client=httpx.AsyncClient(transport=transport)
        )

    with pytest.raises(openai.AuthenticationError) as denied:
        await client(WRONG_KEY).completions.create(**COMPLETION)
    assert denied.value.code == "invalid_api_key" and WRONG_KEY not in str(denied.value)
    good = client(KEY)
    assert (await good.completions.create(**COMPLETION)).usage.prompt_tokens == 3
    with pytest.raises(openai.RateLimitError) as throttled:
        await good.completions.create(**COMPLETION)
    assert throttled.value.code == "rate_limit_exceeded" and throttled.value.response.headers["retry-after"] == "1"


async def test_a_full_engine_queue_is_503_with_retry_after(engine):
    app = make_app(engine, api_keys=frozenset({KEY}))
    held = engine.generate(
        GenerationRequest("hold-the-only-slot", engine.tokenize("w1 w2"), SamplingParams(max_tokens=8))
    )
    try:
        await asyncio.wait_for(anext(held), 30)  # the one request the engine admits is now in flight
        async with http(app, KEY) as good:
            for stream in (False, True):
                refused = await good.post("/v1/completions", json={**COMPLETION, "stream": stream})
                assert_openai_error(refused, 503, "server_overloaded", "server_overloaded")
                assert refused.headers["retry-after"] == "1"
            assert rejections((await good.get("/metrics")).text, "overloaded") == 2
    finally:
        await held.aclose()
    async with http(app, KEY) as good:
        assert (await good.post("/v1/completions", json=COMPLETION)).status_code == 200  # the slot came back


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts_need_no_warning(host, caplog):
    assert warn_if_exposed(host, frozenset()) is False
    assert not caplog.records


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.5", "tandem.example.com"])
def test_exposed_hosts_warn_unless_keys_are_set(host, caplog):
    assert warn_if_exposed(host, frozenset({KEY})) is False
    assert warn_if_exposed(host, frozenset()) is True
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "without API keys" in caplog.text


def test_create_app_warns_about_an_exposed_bind_and_rejects_bad_settings(engine, caplog):
    make_app(engine, bind_host="0.0.0.0")
    assert "without API keys" in caplog.text
    with pytest.raises(TypeError):
        make_app(engine, api_keys=KEY)  # a string, not a set of keys
    with pytest.raises(ValueError):
        make_app(engine, api_keys=frozenset({" "}))
    with pytest.raises(ValueError):
        make_app(engine, rate_limit_burst=5)
    with pytest.raises(ValueError):
        make_app(engine, rate_limit_per_minute=0)


def test_create_app_refuses_unknown_settings(engine):
    with pytest.raises(TypeError, match="rate_limit"):
        AppConfig(rate_limit=5)  # the setting's name, not AppConfig's field
    with pytest.raises(TypeError, match="rate_limit"):
        AppServices(engine, rate_limit=5)  # nor a part the app serves with
    with pytest.raises(ValueError, match="the engine this app serves"):
        AppServices(engine, cascade=CascadeRunner(FakeEngine(), None))  # a runner over another engine
    with pytest.raises(TypeError):
        AppConfig(served_model_names="tiny")  # a string, not a list of names
    with pytest.raises(ValueError, match="at least one model"):
        AppConfig(served_model_names=[])


@pytest.mark.parametrize("tier", ["local", "cloud"])
async def test_each_servers_settings_make_its_app_config(engine, tier):
    section, prefix = {"local": ("server", "TANDEM_"), "cloud": ("cloud_server", "TANDEM_CLOUD_")}[tier]
    env = {
        f"{prefix}RATE_LIMIT": "3",
        f"{prefix}MAX_BODY_BYTES": "2048",
        f"{prefix}STRICT_FIELDS": "1",
        f"{prefix}HOST": "0.0.0.0",
        "TANDEM_TRAFFIC_FEEDBACK_PER_MINUTE": "7",
    }
    settings = load_settings(None, env=env, cli={f"{tier}.model_name": "tiny-alias"})
    config = settings.app_config(tier, frozenset({KEY}))
    assert config.served_model_names == ("tiny-alias",) and config.bind_host == "0.0.0.0"
    assert (config.rate_limit_per_minute, config.max_body_bytes, config.strict_fields) == (3.0, 2048, True)
    assert config.feedback_per_minute == (7.0 if tier == "local" else None)  # feedback is the cascade's
    assert settings.values[section]["max_body_bytes"] == 2048
    async with http(make_app(engine, config), KEY) as client:
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["tiny-alias"]
        unknown = await client.post("/v1/completions", json={**COMPLETION, "model": "tiny-alias", "frobnicate": 1})
        assert unknown.status_code == 400 and "frobnicate" in unknown.json()["error"]["message"]
        assert (await client.post("/v1/completions", content=b"x" * 4096)).status_code == 413
        assert (
            await client.post("/v1/completions", json={**COMPLETION, "model": "tiny-alias"})
        ).status_code == 429  # 4th
    async with http(make_app(engine, config)) as anonymous:
        assert (await anonymous.get("/v1/models")).status_code == 401


def test_cloud_server_rate_limit_zero_means_no_limit():
    config = load_settings(None, env={"TANDEM_CLOUD_RATE_LIMIT": "0"}).app_config("cloud")
    assert config.rate_limit_per_minute is None and config.client_limits().rate is None


async def test_wrong_admin_keys_back_off_like_wrong_api_keys(engine, caplog):
    # /admin/* is a door of the same process: its admin key is checked behind the same failed-key
    # backoff per address, which it shares with the API keys (a guess at either counts for both).
    caplog.set_level(logging.INFO, logger="sdk")
    clock = FakeClock()
    replica = DrainableEngine(engine)
    app = make_app(replica, api_keys=frozenset({KEY}), clock=clock, auth_backoff_after=3, auth_backoff_max_s=8)
    admin_routes(app, replica, ADMIN_KEY)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with http(app, client_ip="10.0.0.9") as guesser, http(app, client_ip="10.0.0.10") as neighbour:
        for guess in range(3):  # the free tries: each checked and refused as before
            reply = await guesser.get("/admin/status", headers={"Authorization": f"Bearer admin-guess-{guess}"})
            assert_openai_error(reply, 403, "permission_error", "forbidden")
        for method, path in [("GET", "/admin/status"), ("POST", "/admin/drain"), ("POST", "/admin/resume")]:
            backed_off = await guesser.request(method, path, headers=admin)  # even the right key: not checked
            error = assert_openai_error(backed_off, 429, "requests", "auth_backoff")  # the API-key path's answer
            assert backed_off.headers["retry-after"] == "1" and "not checked" in error["message"]
        assert not replica.draining
        api = await guesser.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert_openai_error(api, 429, "requests", "auth_backoff")  # one backoff per address, every door
        assert (
            await neighbour.get("/admin/status", headers=admin)
        ).status_code == 200  # another address is not affected

        checked, waited = 0, 0
        for guess in range(
            2000
        ):  # 20 s of guessing at 10 ms a try: one checked at 1, 3, 7 and 15 s (waits 1, 2, 4, 8 s)
            reply = await guesser.post("/admin/drain", headers={"Authorization": f"Bearer admin-guess-{guess}"})
            checked += reply.status_code == 403
            waited += reply.status_code == 429
            clock.now += 0.01
        assert checked == 4 and checked + waited == 2000 and not replica.draining

        for guess in range(3):  # API-key failures lock the admin door of their address too
            assert (
                await neighbour.get("/v1/models", headers={"Authorization": f"Bearer sk-guess-{guess}"})
            ).status_code == 401
        assert_openai_error(await neighbour.get("/admin/status", headers=admin), 429, "requests", "auth_backoff")
        clock.now += 1.0  # its wait is over: the admin key is checked again
        assert (await neighbour.post("/admin/drain", headers=admin)).json()["draining"] is True
        metrics = await neighbour.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
        assert rejections(metrics.text, "auth_backoff") == 3 + 1 + waited + 1
    assert ADMIN_KEY not in caplog.text and "admin-guess" not in caplog.text  # fingerprints only
