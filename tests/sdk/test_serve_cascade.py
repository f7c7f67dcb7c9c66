"""`tandem serve` serving the cascade: the official `openai` client against the real command
(embedded SmolLM2 on the device tier, the embedded PyTorch cloud engine behind loopback
gRPC), models auto / local / cloud, the routing metadata, and the cascade's metrics."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.sdk.test_openai_server import MODEL, metric, wait_until_idle

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


def routing(response) -> dict:
    return response.model_extra["tandem"]


def test_models_and_health_name_both_tiers(server_url, client):
    assert [m.id for m in client.models.list().data] == ["auto", "local", "cloud", "all-MiniLM-L6-v2", MODEL]
    health = httpx.get(f"{server_url}/health").json()
    # The device's KV pool: f16 cells of SmolLM2-135M, 30 layers x 2 x 3 heads x 64 values x 2 bytes a token.
    assert health.pop("kv_cache") == {"dtype": "f16", "tokens": 4096, "tokens_per_gib": round(2**30 / 23040)}
    assert health == {"status": "ok", "local": "ready", "cloud": "closed"}


@pytest.mark.parametrize(
    ("model", "tier", "escalated"),
    [
        ("local", "local", False),
        ("cloud", "cloud", False),
        ("auto:0", "local", False),
        ("auto:1", "cloud", True),
    ],
)
def test_each_routed_model_answers_from_its_tier(client, model, tier, escalated):
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0)
    info = routing(reply)
    assert (info["tier"], info["escalated"], info["degraded"]) == (tier, escalated, False)
    assert reply.model == model and reply.choices[0].message.content
    assert info["cost"][tier]["completion_tokens"] == reply.usage.completion_tokens


def test_auto_streams_with_routing_in_the_last_chunk_and_usage_after(client):
    whole = client.chat.completions.create(model="auto", messages=QUESTION, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="auto",
            messages=QUESTION,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    finish, usage = chunks[-2], chunks[-1]
    assert finish.choices[0].finish_reason == whole.choices[0].finish_reason
    assert routing(finish)["tier"] == routing(whole)["tier"]
    assert usage.choices == [] and usage.usage.completion_tokens == whole.usage.completion_tokens


def test_private_requests_stay_local_even_at_threshold_one(client):
    reply = client.chat.completions.create(
        model="auto:1", messages=QUESTION, max_tokens=4, extra_body={"private": True}
    )
    assert (routing(reply)["tier"], routing(reply)["privacy_reasons"]) == ("local", ["private_flag"])
    email = [{"role": "user", "content": "Write to jane.doe@example.com about lunch."}]
    reply = client.chat.completions.create(model="auto:1", messages=email, max_tokens=4)
    assert routing(reply)["tier"] == "local" and routing(reply)["privacy_reasons"]


def test_routed_requests_refuse_what_they_cannot_honour(client):
    for bad in ({"model": "auto:2"}, {"model": "auto", "n": 2}, {"model": "cloud", "logprobs": True}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**{"messages": QUESTION, "max_tokens": 4, **bad})
        assert caught.value.body["param"] in ("model", "n", "logprobs")
    for bad in ({"n": 2}, {"logprobs": 0}, {"prompt": [10**9]}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(**{"model": "cloud", "prompt": "Paris is", "max_tokens": 4, **bad})
        assert caught.value.body["param"] == next(iter(bad))
    assert client.completions.create(model="local", prompt="Paris is", max_tokens=4).model == "local"


def test_routed_completions_escalate_and_keep_private_prompts_local(client):
    """/v1/completions with a routed model goes through the cascade (sdk.openai_server.routed_completions)."""
    prompt = "The capital of France is"
    escalated = client.completions.create(model="auto:1", prompt=prompt, max_tokens=6, temperature=0)
    assert (routing(escalated)["tier"], routing(escalated)["escalated"]) == ("cloud", True)
    assert escalated.choices[0].text and escalated.usage.completion_tokens == 6
    private = client.completions.create(model="auto:1", prompt=prompt, max_tokens=4, extra_body={"private": True})
    assert (routing(private)["tier"], routing(private)["privacy_reasons"]) == ("local", ["private_flag"])
    email = client.completions.create(model="cloud", prompt="Mail jane.doe@example.com:", max_tokens=4)
    assert (routing(email)["tier"], routing(email)["privacy_reasons"]) == ("local", ["email"])


def test_metrics_count_routes_tokens_and_the_breaker(server_url, client):
    before = httpx.get(f"{server_url}/metrics").text
    client.chat.completions.create(model="cloud", messages=QUESTION, max_tokens=3, temperature=0)
    text = httpx.get(f"{server_url}/metrics").text
    label = '{escalated="false",tier="cloud"}'
    assert (
        metric(text, "tandem:cascade_requests_total", label)
        == metric(before, "tandem:cascade_requests_total", label) + 1
    )
    assert metric(text, "tandem:cascade_tokens_total", '{kind="completion",tier="cloud"}') >= 3
    assert metric(text, "tandem:cloud_circuit_state", '{state="closed"}') == 1
    assert re.search(r'^tandem:cascade_decisions_total\{reason="forced"\} ', text, re.M), text
    # The embedded cloud engine's own numbers, beside the local engine's.
    generated = "tandem:cloud_engine_generation_tokens_total"
    assert metric(text, generated) >= metric(before, generated) + 3
    assert metric(text, "tandem:cloud_engine_kv_blocks_total") > 0
    # The engine frees the request's blocks just after its last token leaves; cached prefix blocks are free, not used.
    wait_until_idle(server_url, engine="cloud_engine_")
