"""The cascade's cloud usage against a real OpenAI-compatible server (llama-cpp-python's
`llama_cpp.server` on the embedded SmolLM2): the tokens recorded are the server's own count.
Counting stream events said one more (issue 26: llama-server's 40 recorded as 41): llama.cpp's
servers end a stream with a chunk that carries only the finish_reason, and this one sends no
usage chunk at all. It also refuses an X-Request-Id that is not a UUID, which tandem sends."""

from __future__ import annotations

import httpx
import pytest

from bench.serve_servers import llama_cpp_server
from router.circuit_breaker import CircuitBreaker
from sdk.cascade.cloud import CloudTimeouts, CloudUsage, stream_from_cloud
from sdk.cloud.openai_client import OpenAICloudClient
from sdk.protocol.engine import SamplingParams
from sdk.engine_common.model_files import default_model_path

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "Count from one to one hundred."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    managed = llama_cpp_server(default_model_path(), threads=1, model_alias=MODEL, n_ctx=512)
    managed.log_path = str(tmp_path_factory.mktemp("llama-cpp-server") / "server.log")
    with managed:
        yield managed


@pytest.mark.parametrize("max_tokens", [1, 12, 40])
async def test_recorded_completion_tokens_are_the_servers(server, max_tokens):
    whole = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        timeout=120,
        json={"model": MODEL, "messages": QUESTION, "max_tokens": max_tokens, "temperature": 0.0},
    ).json()
    expected = whole["usage"]["completion_tokens"]  # the same greedy answer, counted by the server
    client = OpenAICloudClient(f"{server.base_url}/v1")
    usage, texts = CloudUsage(), []
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        async for event in stream_from_cloud(
            client,
            CircuitBreaker(3, 30.0),
            QUESTION,
            params,
            usage,
            model="",
            request_id="chatcmpl-0123456789abcdef0123456789abcdef",
            continuation_token_ids=(),
            timeouts=CloudTimeouts(60.0, 60.0),
        ):
            texts.append(event.text)
    finally:
        await client.close()
    assert "".join(texts) == whole["choices"][0]["message"]["content"]
    assert usage.completion_tokens == expected, (usage, len(texts))


async def test_any_request_id_reaches_the_server_as_a_uuid(server):
    from sdk.cloud.openai_client import request_id_header

    assert request_id_header("chatcmpl-0123456789abcdef0123456789abcdef") == "01234567-89ab-cdef-0123-456789abcdef"
    odd = request_id_header("shadow-my request")
    assert len(odd) == 36 and odd == request_id_header("shadow-my request")
    client = OpenAICloudClient(f"{server.base_url}/v1")
    try:
        events = [
            e async for e in client.generate(QUESTION, SamplingParams(max_tokens=2), request_id="cascade-not-a-uuid")
        ]
    finally:
        await client.close()
    assert events[-1].finish_reason is not None
