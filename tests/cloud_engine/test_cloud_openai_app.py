"""The one OpenAI server, unchanged, over the cloud engine: completions, streaming, errors, metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cloud_engine.async_engine import AsyncCloudEngine
from cloud_engine.config import CloudEngineConfig
from tests.app_helpers import make_app
from tests.cloud_engine.test_cloud_engine_edges import tiny_dir  # noqa: F401  (fixture)


@pytest.fixture
async def client(tiny_dir):  # noqa: F811
    engine = AsyncCloudEngine(
        CloudEngineConfig(model=tiny_dir, model_name="tiny", block_size=4, kv_cache_gb=0.001, max_model_len=64)
    ).start()
    await asyncio.to_thread(engine.wait_ready, 60)
    transport = httpx.ASGITransport(app=make_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c
    engine.shutdown()


async def test_completion_streaming_errors_and_metrics(client):
    body = {"model": "tiny", "prompt": "w5 w6 w7", "max_tokens": 5, "temperature": 0}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and r.json()["usage"]["prompt_tokens"] == 3

    r = await client.post("/v1/completions", json={**body, "stream": True})
    chunks = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]" and len(chunks) >= 2

    r = await client.post("/v1/completions", json={**body, "max_tokens": 100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]

    metrics = (await client.get("/metrics")).text
    for name in (
        "tandem:kv_cache_usage_perc",
        "tandem:prefix_cache_queries_total",
        "tandem:prefix_cache_hits_total",
        "tandem:generation_tokens_total",
        "tandem:time_to_first_token_seconds_bucket",
    ):
        assert name in metrics
    assert "tandem:kv_blocks_used 0.0" in metrics


async def test_tokenize_and_detokenize_round_trip(client):
    """vLLM's /tokenize and /detokenize on the hosted app (the cloud engine's tokenizer)."""
    r = await client.post("/tokenize", json={"model": "tiny", "prompt": "w5 w6 w7", "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) == 3 and body["max_model_len"] == 64 and len(body["token_strs"]) == 3
    back = await client.post("/detokenize", json={"tokens": body["tokens"]})
    # the tiny word-level vocabulary's tokens carry no spaces (a BPE's do: tests/sdk/test_embeddings.py)
    assert back.status_code == 200 and back.json()["prompt"].replace(" ", "") == "w5w6w7"
    for path, bad, param in (
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens[1]"),
        ("/tokenize", {"prompt": "x", "messages": []}, "prompt"),
        ("/tokenize", {"prompt": "x", "lora": "y"}, "lora"),
        ("/tokenize", {"model": "nope", "prompt": "x"}, "model"),
    ):
        r = await client.post(path, json=bad)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, (path, bad, r.text)
