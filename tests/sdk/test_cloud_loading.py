"""While the embedded cloud engine loads, the local tier is the service: /health is 200 with
`"cloud": "loading"`, and a request that needs the cloud is answered locally (degraded:
cloud_loading); one the local tier answers confidently is not degraded at all."""

from __future__ import annotations

import httpx
import pytest

from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.cloud.grpc_client import CloudClient
from tests.app_helpers import make_app
from sdk.protocol.engine import SamplingParams
from tests.conftest import free_port
from tests.sdk.test_cascade import local_engine  # noqa: F401  (fixture)

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@pytest.mark.slow
async def test_cloud_loading_is_answered_locally_and_health_is_green(local_engine):  # noqa: F811
    loaded = [False]
    client = CloudClient(f"127.0.0.1:{free_port()}")  # would fail if called: nothing listens
    runner = CascadeRunner(local_engine, client, CascadeConfig(), cloud_ready=lambda: loaded[0])
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0)
        forced = await runner.complete(QUESTION, params, model="cloud")
        assert (forced.routing.tier, forced.routing.degraded, forced.routing.degraded_reason) == (
            "local",
            True,
            "cloud_loading",
        )
        confident = await runner.complete(QUESTION, params, model="auto:0")  # threshold 0: never escalates
        assert (confident.routing.tier, confident.routing.degraded) == ("local", False)
        assert runner.breaker.num_consecutive_failures == 0  # nothing was sent, nothing counted

        app = make_app(local_engine, cascade=runner, also_ready=lambda: loaded[0])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            health = await http.get("/health")
            body = health.json()
            assert health.status_code == 200 and body.pop("kv_cache")["dtype"] == "f16"  # the device's pool
            assert body == {"status": "ok", "local": "ready", "cloud": "loading"}
            loaded[0] = True
            assert (await http.get("/health")).json()["cloud"] == "closed"
    finally:
        await client.close()
