"""sdk.AsyncClient / sdk.Client over HTTP against the real `tandem serve` (the session's
server): the same objects and stream shape as in-process, typed errors, early close."""

from __future__ import annotations

import httpx
import pytest

from sdk import AsyncClient, Client
from sdk.cloud.grpc_client import CloudUnavailableError
from sdk.protocol.engine import InvalidRequestError
from tests.conftest import free_port
from tests.sdk.test_openai_server import metric, wait_until_idle

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture
async def client(server_url):
    client = AsyncClient(base_url=f"{server_url}/v1")
    yield client
    await client.close()


async def test_completion_and_stream_carry_routing_like_in_process(client):
    whole = await client.chat.completions.create(model="auto:0", messages=QUESTION, max_tokens=8, temperature=0)
    assert whole.tandem["tier"] == "local" and whole.choices[0].message.content
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="auto:0", messages=QUESTION, max_tokens=8, temperature=0, stream=True
        )
    ]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    last = chunks[-1]  # finish reason, usage and routing together, as the in-process stream ends
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert last.usage.completion_tokens == whole.usage.completion_tokens and last.tandem["tier"] == "local"


async def test_private_flag_and_cloud_model_travel_over_http(client):
    private = await client.chat.completions.create(model="auto:1", messages=QUESTION, max_tokens=4, private=True)
    assert private.tandem["tier"] == "local" and private.tandem["privacy_reasons"] == ["private_flag"]
    cloud = await client.chat.completions.create(model="cloud", messages=QUESTION, max_tokens=4)
    assert cloud.tandem["tier"] == "cloud"


async def test_errors_are_typed(client):
    with pytest.raises(InvalidRequestError, match="threshold"):
        await client.chat.completions.create(model="auto:7", messages=QUESTION)
    with pytest.raises(TypeError, match="frequency_penaltyy"):
        await client.chat.completions.create(model="auto", messages=QUESTION, frequency_penaltyy=1)
    unreachable = AsyncClient(base_url=f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(CloudUnavailableError):
        await unreachable.chat.completions.create(messages=QUESTION)
    await unreachable.close()


async def test_closing_a_stream_early_frees_the_request(client, server_url):
    aborted = metric(httpx.get(f"{server_url}/metrics").text, "tandem:num_requests_aborted_total")
    # A story of up to 400 tokens: it cannot end by itself between its first chunk and the close.
    story = [{"role": "user", "content": "Write a long story about a dragon who learns to sail."}]
    stream = await client.chat.completions.create(model="local", messages=story, max_tokens=400, stream=True)
    await anext(stream)
    await stream.aclose()
    text = wait_until_idle(server_url, timeout_s=5.0)
    assert metric(text, "tandem:num_requests_aborted_total") == aborted + 1, "the server never saw the stream close"


def test_sync_client_over_http(server_url):
    with Client(base_url=f"{server_url}/v1") as client:
        out = client.chat.completions.create(model="local", messages=QUESTION, max_tokens=4)
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="local", messages=QUESTION, max_tokens=4, temperature=0, stream=True
            )
        )
    assert out.tandem["tier"] == "local" and streamed
    assert httpx.get(f"{server_url}/health").status_code == 200
