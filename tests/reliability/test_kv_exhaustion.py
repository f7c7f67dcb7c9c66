"""KV exhaustion end to end, through the OpenAI API: a KV pool far smaller than what the
concurrent requests need, so the engines must preempt (and recompute) to finish them all.

The engine-level versions live with the engines (tests/local_runtime/test_engine_lifecycle.py,
tests/cloud_engine/test_cloud_engine_edges.py); these go through the HTTP server: 16
concurrent streaming clients, every one gets 200, its whole output and a finish reason,
/metrics counts preemptions, and the pool is empty at the end.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from bench.served_models import own_chat_model_id
from cloud_engine.async_engine import AsyncCloudEngine
from cloud_engine.config import CloudEngineConfig
from tests.app_helpers import make_app
from tests.cloud_engine.test_cloud_engine_edges import tiny_dir  # noqa: F401  (fixture)
from tests.conftest import running_server
from tests.sdk.test_openai_server import metric

pytestmark = pytest.mark.slow

NUM_CLIENTS = 16
MAX_TOKENS = 40


async def stream_one(http: httpx.AsyncClient, path: str, body: dict) -> dict:
    """One streamed request: status, the text, the finish reason, the usage, and whether [DONE] came."""
    out = {"status": None, "text": "", "finish_reason": None, "usage": None, "done": False}
    async with http.stream(
        "POST", path, json={**body, "stream": True, "stream_options": {"include_usage": True}}
    ) as response:
        out["status"] = response.status_code
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                out["done"] = True
                continue
            chunk = json.loads(data)
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            for choice in chunk.get("choices") or []:
                out["text"] += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
    return out


def assert_all_complete(results: list[dict]) -> None:
    assert [r["status"] for r in results] == [200] * len(results)
    assert all(r["done"] for r in results), "every stream ended with [DONE]"
    assert [r["finish_reason"] for r in results] == ["length"] * len(results)
    assert [r["usage"]["completion_tokens"] for r in results] == [MAX_TOKENS] * len(results), "no token lost"


async def wait_idle(http: httpx.AsyncClient, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = (await http.get("/metrics")).text
        if metric(text, "tandem:num_requests_running") == 0 and metric(text, "tandem:kv_blocks_used") == 0:
            return text
        assert time.monotonic() < deadline, "\n".join(
            l for l in text.splitlines() if l.startswith("tandem:kv") or "requests" in l
        )
        await asyncio.sleep(0.1)


def test_tandem_serve_with_a_tiny_kv_pool_finishes_every_stream(tmp_path):
    # 16 blocks of 16 cells; each request needs ~5 (a ~35-token chat prompt + 40 tokens): 16 x 5 >> 16.
    args = [
        "serve",
        "--cloud",
        "none",
        "--kv-cache-tokens",
        "256",
        "--max-model-len",
        "128",
        "--max-num-seqs",
        "16",
        "--threads",
        "1",
        "--log-level",
        "warning",
    ]
    with running_server(args, tmp_path / "server.log") as (_, base_url):

        async def scenario():
            async with httpx.AsyncClient(base_url=base_url, timeout=240) as http:
                model = own_chat_model_id((await http.get("/v1/models")).json()["data"])

                def body(i: int) -> dict:
                    messages = [{"role": "user", "content": f"Count from {i} upwards."}]
                    return {
                        "model": model,
                        "messages": messages,
                        "max_tokens": MAX_TOKENS,
                        "temperature": 0,
                        "ignore_eos": True,
                    }

                results = await asyncio.gather(
                    *(stream_one(http, "/v1/chat/completions", body(i)) for i in range(NUM_CLIENTS))
                )
                return results, await wait_idle(http)

        results, text = asyncio.run(scenario())
    assert_all_complete(results)
    assert metric(text, "tandem:num_preemptions_total") > 0, "the pool was meant to run out"
    assert metric(text, "tandem:kv_blocks_total") == 16
    assert metric(text, "tandem:num_requests_waiting") == 0


async def test_cloud_engine_with_a_tiny_kv_pool_gives_every_stream_its_greedy_answer(tiny_dir):  # noqa: F811
    roomy = AsyncCloudEngine(
        CloudEngineConfig(
            model=tiny_dir, model_name="tiny", dtype="float32", block_size=4, kv_cache_gb=0.01, max_model_len=64
        )
    ).start()
    tight = AsyncCloudEngine(
        CloudEngineConfig(
            model=tiny_dir,
            model_name="tiny",
            dtype="float32",
            block_size=4,
            kv_cache_gb=0.0001,
            max_model_len=64,
            max_num_seqs=16,
        )
    ).start()
    try:
        await asyncio.gather(asyncio.to_thread(roomy.wait_ready, 60), asyncio.to_thread(tight.wait_ready, 60))
        prompts = [" ".join(f"w{(7 * i + j) % 50 + 1}" for j in range(6 + i % 5)) for i in range(NUM_CLIENTS)]

        def body(prompt: str) -> dict:
            return {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}

        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=make_app(roomy)), base_url="http://roomy"
        ) as http:
            alone = [await stream_one(http, "/v1/completions", body(p)) for p in prompts]  # one at a time
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=make_app(tight)), base_url="http://tight"
        ) as http:
            total = metric((await http.get("/metrics")).text, "tandem:kv_blocks_total")
            assert total * 4 < NUM_CLIENTS * MAX_TOKENS, "the pool must be too small for all of them at once"
            results = await asyncio.gather(*(stream_one(http, "/v1/completions", body(p)) for p in prompts))
            text = await wait_idle(http)
    finally:
        roomy.shutdown()
        tight.shutdown()
    assert_all_complete(results)
    assert metric(text, "tandem:num_preemptions_total") > 0
    assert [r["text"] for r in results] == [r["text"] for r in alone]  # recompute gives the same greedy tokens
