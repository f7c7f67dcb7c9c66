"""A replica taken out of rotation (sdk.openai_server.drain) and the client that balances over
replicas (sdk.cloud.grpc_client: round_robin with grpc.health.v1 checks), in one process: three
gRPC servers, each with its own DrainableEngine over the one tiny engine.

The three-process version (`tandem cloud serve` ×3, SIGTERM and SIGKILL) is
tests/cloud_engine/test_replica_processes.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server, stop_grpc_server
from sdk.cloud.grpc_client import CloudClient, CloudUnavailableError
from sdk.cloud.targets import is_replica_target
from tests.app_helpers import make_app
from sdk.openai_server.drain import DrainableEngine, admin_routes
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, wait_until  # noqa: F401  (fixtures)

ADMIN = "admin-key-0123456789abcdef"
KEY = "sk-replica-0123456789"
SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = [1, 2, 3, 4]


@pytest.fixture
async def replicas(engine):  # noqa: F811
    wrappers = [DrainableEngine(engine) for _ in range(3)]
    servers = [await start_grpc_server(w, GrpcServerConfig(port=0)) for w in wrappers]
    target = "ipv4:" + ",".join(f"127.0.0.1:{bound_port(s)}" for s in servers)
    client = CloudClient(target)
    yield wrappers, servers, client
    await client.close()
    for server in servers:
        await stop_grpc_server(server, grace_s=0)


async def drain_stream(client, params=SHORT):
    return [event async for event in client.generate(PROMPT, params, model="tiny")]


def test_replica_targets_are_grpc_name_syntax():
    assert is_replica_target("ipv4:127.0.0.1:1,127.0.0.1:2") and is_replica_target("dns:///cloud.internal:50051")
    assert not is_replica_target("127.0.0.1:50051") and not is_replica_target("unix:/tmp/sock")


async def test_calls_spread_over_the_replicas_and_skip_a_drained_one(replicas):
    wrappers, servers, client = replicas
    assert await wait_until(lambda: all(w.is_ready for w in wrappers), 30)
    await drain_stream(client)  # connects; round robin picks among the replicas that are READY and SERVING
    await asyncio.sleep(0.5)
    before = [w.started for w in wrappers]
    for _ in range(30):
        assert (await drain_stream(client))[-1].finish_reason == "length"
    split = [w.started - b for w, b in zip(wrappers, before)]
    assert sum(split) == 30 and max(split) - min(split) <= 2, split  # in turn: 10 each

    wrappers[0].drain()
    await asyncio.sleep(0.6)  # health turns NOT_SERVING within HEALTH_POLL_S; the client's watch sees it
    before = [w.started for w in wrappers]
    for _ in range(20):
        assert (await drain_stream(client))[-1].finish_reason == "length"  # none refused: nobody sends it any
    split = [w.started - b for w, b in zip(wrappers, before)]
    assert split[0] == 0 and split[1] + split[2] == 20, split

    wrappers[0].resume()
    await asyncio.sleep(0.6)
    before = wrappers[0].started
    for _ in range(9):
        await drain_stream(client)
    assert wrappers[0].started - before >= 2  # back in rotation


async def test_a_draining_replica_finishes_its_streams_and_refuses_new_ones(engine):  # noqa: F811
    replica = DrainableEngine(engine)
    server = await start_grpc_server(replica, GrpcServerConfig(port=0, api_keys=frozenset({KEY})))
    client = CloudClient(f"127.0.0.1:{bound_port(server)}", api_key=KEY)
    app = make_app(replica, api_keys={KEY})
    admin_routes(app, replica, ADMIN)
    try:
        assert await wait_until(lambda: replica.is_ready, 30)
        long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        running = asyncio.create_task(drain_stream(client, long))
        assert await wait_until(lambda: replica.in_flight == 1)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            assert (
                await http.post("/admin/drain", headers={"Authorization": f"Bearer {KEY}"})
            ).status_code == 403  # an API key is not the admin key
            drained = await http.post("/admin/drain", headers={"Authorization": f"Bearer {ADMIN}"})
            assert drained.status_code == 200 and drained.json() == {"draining": True, "in_flight": 1, "started": 1}
            health = await http.get("/health")
            assert health.status_code == 503 and "draining" in health.json()["error"]["message"]
            assert await _health(client, "NOT_SERVING")
            with pytest.raises(CloudUnavailableError, match="draining"):  # new work goes elsewhere
                await drain_stream(client)
            refused = await http.post(
                "/v1/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2},
            )
            assert refused.status_code == 503
            events = await running  # the stream that was running goes on to its end
            assert events[-1].finish_reason == "length" and len(events) == 200
            assert await replica.wait_idle(1.0) and replica.in_flight == 0
            resumed = await http.post("/admin/resume", headers={"Authorization": f"Bearer {ADMIN}"})
            assert resumed.json()["draining"] is False and await _health(client, "SERVING")
            assert (await drain_stream(client))[-1].finish_reason == "length"
    finally:
        await client.close()
        await stop_grpc_server(server, grace_s=0)


async def _health(client: CloudClient, status: str, timeout_s: float = 3.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if await client.health("tandem.v1.Tandem") == status:
            return True
        await asyncio.sleep(0.05)
    return False
