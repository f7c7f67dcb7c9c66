"""A replicated cloud tier: three `tandem cloud serve` processes on loopback, one client
balancing over them (`ipv4:127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`: round robin over the
replicas whose grpc.health.v1 says SERVING), every call made the way the cascade makes it
(sdk.cascade.cloud.stream_from_cloud: one retry of a call that produced no token).

Phases: all healthy (the load splits within 20%); one drained by the admin call while it has
streams (they finish; new calls go elsewhere); one killed (SIGKILL) mid-load; one stopped by
SIGTERM with streams in flight (they finish within the grace period; the process exits 0).
Nothing is lost: every call ends complete, or, when the kill cut its stream, with an error the
caller sees after the tokens it got (counted); no call that produced nothing fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from router.circuit_breaker import CircuitBreaker
from sdk.cascade.cloud import CloudFailed, CloudTimeouts, CloudUsage, stream_from_cloud
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.grpc_helpers import long_tiny_dir  # noqa: F401  (fixture)
from tests.conftest import REPO_ROOT, _log_tail, free_port, wait_until_healthy

pytestmark = pytest.mark.slow

ADMIN = "replica-admin-key-0123456789"
PROMPT = [1, 5, 9, 13]
SHORT = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
LONGEST = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)  # phase 3: still running when B is killed


@dataclass
class Replica:
    process: subprocess.Popen
    http_url: str
    grpc_port: int
    log_path: Path

    def status(self) -> dict:
        return httpx.get(
            f"{self.http_url}/admin/status", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        ).json()

    def admin(self, action: str) -> dict:
        return httpx.post(
            f"{self.http_url}/admin/{action}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        ).json()


@dataclass
class Outcome:
    tokens: int = 0
    finish_reason: str | None = None
    failure: str | None = None  # CloudFailed's reason


def start_replica(model_dir: str, folder) -> Replica:
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
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
        "0.02",
        "--port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--admin-key-file",
        str(folder / "admin"),
        "--drain-grace-s",
        "60",
        "--log-level",
        "warning",
        "--threads",
        "1",
    ]  # three processes on 2 cores with torch's default threads ran the test 7x slower
    log_path = folder / f"replica-{grpc_port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    return Replica(process, f"http://127.0.0.1:{http_port}", grpc_port, log_path)


@pytest.fixture(scope="module")
def replicas(long_tiny_dir, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("replicas")
    (folder / "admin").write_text(ADMIN + "\n")
    started = [start_replica(long_tiny_dir, folder) for _ in range(3)]
    try:
        for replica in started:
            wait_until_healthy(replica.process, replica.http_url, replica.log_path, "tandem cloud serve (replica)")
        yield started
    finally:
        for replica in started:
            if replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait()


async def call(
    client: CloudClient, breaker: CircuitBreaker, params: SamplingParams, outcome: Outcome | None = None
) -> Outcome:
    outcome = outcome or Outcome()
    try:
        stream = stream_from_cloud(
            client,
            breaker,
            PROMPT,
            params,
            CloudUsage(),
            model="tiny",
            request_id="r",
            continuation_token_ids=(),
            timeouts=CloudTimeouts(first_token_s=60, stall_s=30),
        )
        async for event in stream:
            outcome.tokens += 1
            outcome.finish_reason = event.finish_reason or outcome.finish_reason
    except CloudFailed as failed:
        outcome.failure = failed.reason
    return outcome


def started_counts(replicas: list[Replica]) -> list[int]:
    return [r.status()["started"] for r in replicas]


async def wait_for(condition, timeout_s: float = 20.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if await asyncio.to_thread(condition):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_three_replicas_split_drain_kill_and_stop(replicas):
    a, b, c = replicas
    target = "ipv4:" + ",".join(f"127.0.0.1:{r.grpc_port}" for r in replicas)
    client = CloudClient(target)
    breaker = CircuitBreaker()
    try:
        # Connect to all three first (round robin picks among the READY ones).
        for _ in range(6):
            assert (await call(client, breaker, SHORT)).finish_reason == "length"
        await asyncio.sleep(0.5)

        # 1. All healthy: 60 calls, 6 at a time, split within 20% of a third each.
        before = started_counts(replicas)
        outcomes = await _in_waves(client, breaker, SHORT, 60, 6)
        assert all(o.finish_reason == "length" and o.tokens == 8 for o in outcomes)
        split = [after - b0 for after, b0 in zip(started_counts(replicas), before)]
        assert sum(split) == 60 and all(abs(n - 20) <= 4 for n in split), split

        # 2. Drained by the admin call while it runs streams: they finish, new calls go elsewhere.
        long_calls = [asyncio.create_task(call(client, breaker, LONG)) for _ in range(6)]
        assert await wait_for(lambda: a.status()["in_flight"] >= 1), "replica A never got a long stream"
        assert a.admin("drain")["draining"] is True
        await asyncio.sleep(0.5)  # health NOT_SERVING reaches the client's watch
        drained_at = a.status()["started"]
        shorts = await _in_waves(client, breaker, SHORT, 30, 6)
        assert all(o.finish_reason == "length" for o in shorts + await asyncio.gather(*long_calls))
        assert all(o.tokens == LONG.max_tokens for o in await asyncio.gather(*long_calls))  # A's streams finished whole
        assert a.status() == {"draining": True, "in_flight": 0, "started": drained_at}  # it took nothing new
        a.admin("resume")
        await asyncio.sleep(0.5)

        # 3. One killed mid-load: its streams end with an error after the tokens they got; the rest
        # complete; calls made after the kill go to the other two.
        outcomes = [Outcome() for _ in range(9)]
        long_calls = [asyncio.create_task(call(client, breaker, LONGEST, outcome)) for outcome in outcomes]
        # Kill B once every stream has its first token: B's are then cut mid-way, not retried elsewhere.
        assert await wait_for(
            lambda: all(o.tokens >= 1 or o.failure for o in outcomes) and b.status()["in_flight"] >= 1
        ), f"replica B never got a long stream: {outcomes}"
        b.process.kill()
        b.process.wait()
        after_kill = await _in_waves(client, breaker, SHORT, 20, 4)
        await asyncio.gather(*long_calls)
        cut = [o for o in outcomes if o.failure is not None]
        whole = [o for o in outcomes if o.failure is None]
        assert cut, f"no stream was running on the killed replica: {outcomes}"
        assert all(o.failure == "cloud_unavailable" and 0 < o.tokens < LONGEST.max_tokens for o in cut)  # seen, counted
        assert all(o.finish_reason == "length" and o.tokens == LONGEST.max_tokens for o in whole)
        assert all(o.finish_reason == "length" and o.failure is None for o in after_kill)
        # One replica's cut streams say nothing about the tier: the breaker stays closed.
        assert breaker.state.value == "closed" and breaker.num_consecutive_failures == 0

        # 4. SIGTERM on a replica with streams in flight: NOT_SERVING at once, its streams finish
        # within the grace period, then it exits 0; the last replica takes the new calls.
        long_calls = [asyncio.create_task(call(client, breaker, LONG)) for _ in range(4)]
        assert await wait_for(lambda: a.status()["in_flight"] >= 1), "replica A never got a long stream"
        a.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        last = await _in_waves(client, breaker, SHORT, 10, 2)
        outcomes = await asyncio.gather(*long_calls)
        assert all(o.finish_reason == "length" and o.tokens == LONG.max_tokens for o in outcomes), outcomes
        assert all(o.finish_reason == "length" and o.tokens == SHORT.max_tokens for o in last), last
        assert await asyncio.to_thread(a.process.wait, 60) == 0, _log_tail(a.log_path)
    finally:
        await client.close()
    assert c.process.poll() is None, _log_tail(c.log_path)


async def _in_waves(client, breaker, params, num: int, concurrency: int) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for start in range(0, num, concurrency):
        outcomes += await asyncio.gather(*(call(client, breaker, params) for _ in range(min(concurrency, num - start))))
    return outcomes
