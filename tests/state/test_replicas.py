"""Three `tandem cloud serve` processes on one state database (`--state-db`), as docs/cloud-at-scale.md's
"More than one replica" runs them: one budget, one rate limit and one failed-key backoff for all three.

Pinned: 120 concurrent requests spread over the replicas against a budget for 50 are held to 50, the
spend equals what the answers' usage costs, and every replica's GET /v1/budget says the same; a rate
limit of R a minute admits R across the three, not 3R; a replica SIGKILLed mid-stream holds no
reservation past its lease; the database stopped mid-run gives budgeted requests a 503 naming it while
requests without a budget are served, /health and /metrics say so, and serving resumes when it is back.

The tiny random-weight model; prices of 0 per prompt token and 1 USD per completion token, so with
ignore_eos a request's reservation (max_tokens) is exactly its cost and the bound is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import psycopg
import pytest

from sdk.serving.api_keys import key_fingerprint
from tests.cloud_engine.grpc_helpers import LONG, long_tiny_dir  # noqa: F401  (fixture)
from tests.conftest import REPO_ROOT, _log_tail, clean_env, free_port, stop_process, wait_until_healthy

pytestmark = pytest.mark.slow

KEY, FREE_KEY = "sk-replicas-budgeted-0123456789", "sk-replicas-free-0123456789"
MAX_TOKENS = 4
USD_PER_TOKEN = 1.0
REQUEST_USD = MAX_TOKENS * USD_PER_TOKEN
LEASE_S = 2.0
ASK = {"model": "tiny", "prompt": "w1 w2 w3", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


class Replica:
    def __init__(self, process: subprocess.Popen, base_url: str, log_path):
        self.process, self.base_url, self.log_path = process, base_url, log_path

    def client(self, key: str = KEY) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=120, headers={"Authorization": f"Bearer {key}"})


@contextlib.contextmanager
def replicas(model_dir: str, folder, state_db_url: str, count: int = 3, extra: tuple[str, ...] = ()):
    """`count` replicas of `tandem cloud serve` on one state database, started together."""
    (folder / "keys").write_text(f"{KEY}\n{FREE_KEY}\n")
    started = []
    for index in range(count):
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "sdk.cli",
            "cloud",
            "serve",
            "--model",
            model_dir,
            "--model-name",
            "tiny",
            "--dtype",
            "float32",
            "--kv-cache-gb",
            "0.01",
            "--threads",
            "1",
            "--port",
            str(port),
            "--grpc-port",
            str(free_port()),
            "--api-key-file",
            str(folder / "keys"),
            "--state-db",
            state_db_url,
            "--state-db-lease-s",
            str(LEASE_S),
            "--log-level",
            "warning",
            *extra,
        ]
        log_path = folder / f"replica-{index}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=REPO_ROOT)
        started.append(Replica(process, f"http://127.0.0.1:{port}", log_path))
    try:
        for replica in started:
            wait_until_healthy(replica.process, replica.base_url, replica.log_path, "tandem cloud serve")
        yield started
    finally:
        for replica in started:
            stop_process(replica.process)


def budgets_file(folder, usd_per_day: float):
    """KEY gets `usd_per_day`; FREE_KEY has no budget at all."""
    path = folder / "budgets.toml"
    path.write_text(f"[default]\nusd_per_day = {usd_per_day!r}\n\n[keys.{key_fingerprint(FREE_KEY)}]\n")
    return path


def budgeted(folder, usd_per_day: float) -> tuple[str, ...]:
    return (
        "--budgets-file",
        str(budgets_file(folder, usd_per_day)),
        "--price-input-per-million",
        "0",
        "--price-output-per-million",
        str(USD_PER_TOKEN * 1e6),
    )


@pytest.fixture(scope="module")
def budgeted_replicas(long_tiny_dir, postgres_server, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("replicas")
    url = postgres_server.new_database()
    with replicas(long_tiny_dir, folder, url, extra=budgeted(folder, 50.5 * REQUEST_USD)) as started:
        yield started, url


def usage_usd(answer: dict) -> float:
    return answer["usage"]["completion_tokens"] * USD_PER_TOKEN


async def test_one_budget_across_three_replicas(budgeted_replicas):
    started, url = budgeted_replicas

    async def ask(index: int) -> httpx.Response:
        async with started[index % 3].client() as http:
            return await http.post("/v1/completions", json=ASK)

    replies = await asyncio.gather(*(ask(i) for i in range(120)))
    ok = [reply.json() for reply in replies if reply.status_code == 200]
    refused = [reply for reply in replies if reply.status_code == 429]
    assert len(ok) + len(refused) == 120, {reply.status_code for reply in replies}
    assert len(ok) == 50  # each reservation is its exact cost: the limit holds 50.5 of them
    assert {reply.json()["error"]["code"] for reply in refused} == {"insufficient_quota"}
    spent = sum(usage_usd(answer) for answer in ok)
    assert spent == pytest.approx(50 * REQUEST_USD)
    await asyncio.sleep(0.5)  # settles are written by each replica's writer right after the answer
    reports = []
    for replica in started:
        async with replica.client() as http:
            [limit] = (await http.get("/v1/budget")).json()["scopes"][0]["limits"]
            reports.append((limit["spent"], limit["requests"]))
    assert reports == [(pytest.approx(spent), 50)] * 3  # every replica reads the one ledger
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM tandem_reservations").fetchone() == (0,)


async def test_a_replica_killed_mid_stream_holds_nothing_past_its_lease(budgeted_replicas):
    started, url = budgeted_replicas
    victim = started[2]
    # A key with a budget left: raise the limit for this test (the file is reloaded when it changes).
    with psycopg.connect(url) as conn:
        spent = conn.execute("SELECT coalesce(max(usd), 0) FROM tandem_spend WHERE scope LIKE 'key:%%'").fetchone()[0]
    folder = victim.log_path.parent
    budgets_file(folder, spent + 10 * LONG * USD_PER_TOKEN)
    os.utime(folder / "budgets.toml", ns=(time.time_ns(), time.time_ns() + 10**9))
    await asyncio.sleep(2.5)  # RELOAD_CHECK_S

    async with victim.client() as http:
        async with http.stream("POST", "/v1/completions", json={**ASK, "max_tokens": LONG, "stream": True}) as reply:
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    break
            victim.process.send_signal(signal.SIGSTOP)  # frozen mid-stream, still holding its reservation
            try:
                with psycopg.connect(url) as conn:
                    [(held,)] = conn.execute("SELECT coalesce(sum(usd), 0) FROM tandem_reservations").fetchall()
                assert held == pytest.approx(LONG * USD_PER_TOKEN)
            finally:
                victim.process.kill()
                victim.process.wait()
    killed_at = time.monotonic()
    deadline = killed_at + LEASE_S + 10
    while True:
        with psycopg.connect(url) as conn:
            [(left,)] = conn.execute("SELECT count(*) FROM tandem_reservations").fetchall()
        if left == 0:
            break
        assert time.monotonic() < deadline, "the killed replica's reservation outlived its lease"
        await asyncio.sleep(0.2)
    # The two living replicas take requests against the budget the dead one held.
    async with started[0].client() as http:
        assert (await http.post("/v1/completions", json=ASK)).status_code == 200


async def test_the_database_stopped_mid_run_then_back(budgeted_replicas, postgres_server):
    started, _ = budgeted_replicas
    replica = started[0]
    postgres_server.stop()
    try:
        deadline = time.monotonic() + 15
        async with replica.client() as http, replica.client(FREE_KEY) as free:
            while (await http.post("/v1/completions", json=ASK)).status_code != 503:
                assert time.monotonic() < deadline, "a budgeted request was served without the state database"
                await asyncio.sleep(0.2)
            refused = await http.post("/v1/completions", json=ASK)
            error = refused.json()["error"]
            assert refused.status_code == 503 and error["code"] == "state_database_unavailable"
            assert "the state database is unavailable" in error["message"] and "Retry-After" in refused.headers
            assert "127.0.0.1" not in refused.text and "postgresql://" not in refused.text  # no address to callers
            answered = await free.post("/v1/completions", json=ASK)  # no budget: still served
            assert answered.status_code == 200, answered.text
            health = (await http.get("/health")).json()
            assert health == {"status": "ok", "state_db": "unreachable"}  # why: in the log and /admin/status only
            assert "tandem:state_db_up 0.0" in (await http.get("/metrics")).text
    finally:
        postgres_server.start()
    deadline = time.monotonic() + 20
    async with replica.client() as http:
        while (reply := await http.post("/v1/completions", json=ASK)).status_code == 503:
            assert time.monotonic() < deadline, f"serving did not resume: {reply.text}\n{_log_tail(replica.log_path)}"
            await asyncio.sleep(0.3)
        assert reply.status_code in (200, 429), reply.text  # back: billed (or over the budget) again
        assert (await http.get("/health")).json()["state_db"] == "ok"


async def test_one_rate_limit_across_three_replicas(long_tiny_dir, postgres_server, tmp_path):  # noqa: F811
    """30 a minute (burst 30): 90 requests in a few seconds, round robin, admit about 30, not 90."""
    url = postgres_server.new_database()
    with replicas(long_tiny_dir, tmp_path, url, extra=("--rate-limit", "30", "--auth-backoff-after", "3")) as started:

        async def ask(index: int, key: str = FREE_KEY) -> httpx.Response:
            async with started[index % 3].client(key) as http:
                return await http.post("/v1/completions", json=ASK)

        began = time.monotonic()
        replies = await asyncio.gather(*(ask(i) for i in range(90)))
        elapsed = time.monotonic() - began
        admitted = sum(reply.status_code == 200 for reply in replies)
        assert {reply.status_code for reply in replies} <= {200, 429}
        assert 30 <= admitted <= 30 + elapsed * 0.5 + 1, (admitted, elapsed)  # refill: half a token a second
        # The failed-key backoff is one count per address too: 3 wrong keys, one on each replica, start it.
        for index in range(3):
            assert (await ask(index, "sk-wrong-key-0123456789")).status_code == 401
        backing_off = await ask(0, "sk-wrong-key-0123456789")
        assert backing_off.status_code == 429 and "Retry-After" in backing_off.headers
