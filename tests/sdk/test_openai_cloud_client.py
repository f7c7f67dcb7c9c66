"""OpenAICloudClient against a real OpenAI-compatible server on loopback: tandem's own app
over the tiny random-weight cloud engine, served by uvicorn in a background thread."""

from __future__ import annotations

import time

import httpx
import pytest

from sdk.protocol.cloud_backend import CloudStatus
from router.failure_kinds import FailureKind, classify_failure
from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.cloud.grpc_client import (
    CloudContextLengthError,
    CloudDeadlineExceededError,
    CloudError,
    CloudInvalidArgumentError,
    CloudModel,
    CloudOverloadedError,
    CloudQuotaExceededError,
    CloudUnauthenticatedError,
    CloudUnavailableError,
)
from sdk.protocol.engine import SamplingParams
from sdk.cloud.openai_client import UNKNOWN_TOKEN_ID, OpenAICloudClient
from sdk.cloud.openai_wire import ChunkStream, error_from_response, request_body
from tests.app_helpers import make_app
from tests.cloud_engine.grpc_helpers import LONG, MAX_MODEL_LEN, long_tiny_dir, make_engine, wait_drained  # noqa: F401
from tests.conftest import free_port, served_in_thread
from tests.sdk.test_cascade import local_engine  # noqa: F401  (fixture: the embedded GGUF engine)

KEY = "sk-openai-cloud-0123456789"
MESSAGES = [{"role": "user", "content": "w5 w6 w7 w8"}]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
ENDLESS = SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True)


class TemplatedEngine:
    """The tiny engine has no chat template: render messages as their words after BOS
    (the approach of tests/sdk/test_cascade.py's RecordingCloudEngine)."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def apply_chat_template(self, messages):
        return [1] + self.engine.tokenize(" ".join(m["content"] for m in messages), add_special=False)


@pytest.fixture(scope="module")
def engine(long_tiny_dir):  # noqa: F811
    engine = make_engine(long_tiny_dir)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def base_url(engine):
    """http://127.0.0.1:PORT/v1 of the OpenAI app (key required) served in a thread."""
    with served_in_thread(
        make_app(TemplatedEngine(engine), api_keys=frozenset({KEY})), "openai-cloud-test-server"
    ) as url:
        yield f"{url}/v1"


@pytest.fixture
async def client(base_url):
    async with OpenAICloudClient(base_url, api_key=KEY) as client:
        yield client


async def drain(events) -> list:
    return [event async for event in events]


async def test_stream_equals_the_non_streamed_answer_with_usage(client, base_url):
    events = await drain(client.generate(MESSAGES, GREEDY))  # model "" -> the first listed model
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
        response = await http.post(
            f"{base_url}/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "max_tokens": GREEDY.max_tokens, "temperature": 0},
        )
    assert response.status_code == 200, response.text
    same = response.json()
    assert "".join(e.text for e in events) == same["choices"][0]["message"]["content"]
    assert [e.finish_reason for e in events] == [None] * (len(events) - 1) + [same["choices"][0]["finish_reason"]]
    last = events[-1]
    assert (last.num_prompt_tokens, last.num_output_tokens) == (
        same["usage"]["prompt_tokens"],
        same["usage"]["completion_tokens"],
    )
    assert last.num_prompt_tokens == 1 + len(MESSAGES[0]["content"].split())
    assert all(e.token_id == UNKNOWN_TOKEN_ID for e in events)
    assert [e.num_output_tokens for e in events[:-1]] == list(range(1, len(events)))
    assert client._default_model == "tiny"


async def test_text_prompt_and_logprobs(client):
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=2, ignore_eos=True)
    events = await drain(client.generate("w5 w6 w7 w8", params, model="tiny", request_id="req-1"))
    assert len(events) == 4 and events[-1].finish_reason == "length"
    for event in events:
        assert event.request_id == "req-1" and event.logprob <= 0.0 and len(event.top_logprobs) == 2
        assert event.top_logprobs[0].logprob >= event.top_logprobs[1].logprob and event.margin >= 0.0
    assert events[-1].num_output_tokens == 4


async def test_models_and_health(client, engine):
    # The card's tandem extension: the served vocabulary's fingerprint, as the engine computes it.
    assert await client.list_models() == [CloudModel("tiny", MAX_MODEL_LEN, engine.vocabulary_fingerprint)]
    assert engine.vocabulary_fingerprint.startswith(f"{len(engine.engine.tokenizer)}:")
    assert await client.health() == "SERVING"


async def test_wrong_key_is_unauthenticated(base_url):
    async with OpenAICloudClient(base_url, api_key="sk-wrong-0123456789") as client:
        with pytest.raises(CloudUnauthenticatedError) as raised:
            await drain(client.generate(MESSAGES, GREEDY, model="tiny"))
        assert raised.value.code == CloudStatus.UNAUTHENTICATED and "Incorrect API key" in str(raised.value)
        assert classify_failure(raised.value) is FailureKind.AUTH
        with pytest.raises(CloudUnauthenticatedError):
            await client.health()


async def test_invalid_requests_carry_the_servers_message(client):
    too_many_stops = SamplingParams(max_tokens=2, stop=[f"x{i}" for i in range(17)])
    with pytest.raises(CloudInvalidArgumentError) as raised:
        await drain(client.generate(MESSAGES, too_many_stops, model="tiny"))
    assert not isinstance(raised.value, CloudContextLengthError)
    assert str(raised.value) == "stop accepts at most 16 strings, got 17" and raised.value.param == "stop"
    assert raised.value.code == CloudStatus.INVALID_ARGUMENT
    assert classify_failure(raised.value) is FailureKind.INVALID_ARGUMENT

    with pytest.raises(CloudContextLengthError) as raised:
        await drain(client.generate(MESSAGES, SamplingParams(max_tokens=MAX_MODEL_LEN + 1), model="tiny"))
    assert "maximum context length" in str(raised.value) and raised.value.param == "max_tokens"

    with pytest.raises(CloudInvalidArgumentError, match="does not exist"):
        await drain(client.generate(MESSAGES, GREEDY, model="no-such-model"))


async def test_unreachable_server_is_unavailable():
    async with OpenAICloudClient(f"http://127.0.0.1:{free_port()}/v1") as client:
        with pytest.raises(CloudUnavailableError) as raised:
            await drain(client.generate(MESSAGES, GREEDY, model="tiny"))
        assert raised.value.code == CloudStatus.UNAVAILABLE
        assert classify_failure(raised.value) is FailureKind.UNAVAILABLE
        with pytest.raises(CloudUnavailableError):
            await client.health()


async def test_deadline_bounds_the_whole_stream(base_url, engine):
    async with OpenAICloudClient(base_url, api_key=KEY, timeout_s=0.3) as client:
        started = time.monotonic()
        with pytest.raises(CloudDeadlineExceededError) as raised:
            await drain(client.generate(MESSAGES, ENDLESS, model="tiny"))
        assert time.monotonic() - started < 5
        assert classify_failure(raised.value) is FailureKind.DEADLINE
    assert await wait_drained(engine)  # the dropped connection aborted the request


async def test_closing_the_stream_early_frees_the_request(client, engine):
    events = client.generate(MESSAGES, ENDLESS, model="tiny")
    first = [await anext(events) for _ in range(3)]
    assert all(e.finish_reason is None for e in first) and engine.stats().num_running == 1
    await events.aclose()
    assert await wait_drained(engine)


async def test_continuation_and_token_ids_are_refused_by_a_server_that_is_not_vllm(client):
    await client.discover()
    assert client.traits.kind == "openai" and client.supports_continuation is False  # tandem's own app has no /version
    with pytest.raises(CloudInvalidArgumentError, match="handoff = restart") as raised:
        await drain(client.generate(MESSAGES, GREEDY, continuation_token_ids=[5, 6]))
    assert raised.value.param == "handoff"
    with pytest.raises(CloudInvalidArgumentError, match="token ids"):
        await drain(client.generate([5, 6, 7], GREEDY))


# -- the wire mapping on its own (shapes our server never sends) -------------------------------


@pytest.mark.parametrize(
    "status, body, headers, cls, kind, message",
    [
        (403, b'{"error": {"message": "not allowed", "type": "x"}}', {}, CloudError, FailureKind.AUTH, "not allowed"),
        (
            429,
            b'{"error": {"message": "slow down"}}',
            {"retry-after": "7"},
            CloudOverloadedError,
            FailureKind.OVERLOADED,
            "slow down",
        ),
        (
            429,
            b'{"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", '
            b'"code": "insufficient_quota"}}',
            {},
            CloudQuotaExceededError,
            FailureKind.OVERLOADED,
            "current quota",
        ),  # spent credit: the cascade answers locally
        (503, b'{"error": {"message": "loading"}}', {}, CloudUnavailableError, FailureKind.UNAVAILABLE, "loading"),
        (
            503,
            b'{"error": {"message": "queue full", "code": "server_overloaded"}}',
            {"retry-after": "2"},
            CloudOverloadedError,
            FailureKind.OVERLOADED,
            "queue full",
        ),  # tandem's own full queue
        (504, b"gateway timeout", {}, CloudDeadlineExceededError, FailureKind.DEADLINE, "gateway timeout"),
        (500, b'{"error": {"message": "boom"}}', {}, CloudError, FailureKind.INTERNAL, "boom"),
        (
            400,
            b'{"object": "error", "message": "This model\'s maximum context length is 8 tokens", "code": 400}',
            {},
            CloudContextLengthError,
            FailureKind.INVALID_ARGUMENT,
            "maximum context length",
        ),  # vLLM's flat shape
    ],
)
def test_http_errors_map_onto_the_grpc_clients_classes(status, body, headers, cls, kind, message):
    error = error_from_response(status, headers, body, "http://cloud/v1")
    assert type(error) is cls and isinstance(error.code, CloudStatus) and message in str(error)
    assert classify_failure(error) is kind
    if "retry-after" in headers:
        assert error.retry_after_s == float(headers["retry-after"])


def test_in_stream_errors_and_unfinished_streams_are_internal():
    stream = ChunkStream("r")
    assert stream.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}) is None
    assert stream.feed({"choices": [{"index": 0, "delta": {"content": "a"}}]}).text == "a"
    with pytest.raises(CloudError, match="overloaded") as raised:
        stream.feed({"error": {"message": "engine overloaded", "type": "server_error"}})
    assert raised.value.code == CloudStatus.INTERNAL
    with pytest.raises(CloudError, match="without a finish_reason") as raised:
        stream.finish()
    assert raised.value.code == CloudStatus.INTERNAL


def test_request_body_sends_only_what_differs_from_the_defaults():
    # Unset sampling fields are not sent: the server applies its own defaults for its model.
    assert request_body([], SamplingParams(), "m") == {
        "model": "m",
        "messages": [],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 16,
    }
    body = request_body([], SamplingParams(temperature=1.0, top_p=0.9, top_k=0), "m")
    assert (body["temperature"], body["top_p"], "top_k" in body) == (1.0, 0.9, False)
    body = request_body([], SamplingParams(top_k=5, seed=3, stop=["x"], logprobs=0), "m", priority=2)
    assert (body["top_k"], body["seed"], body["stop"], body["logprobs"], body["top_logprobs"], body["priority"]) == (
        5,
        3,
        ["x"],
        True,
        0,
        2,
    )


# -- the cascade over it -------------------------------------------------------------------------


@pytest.mark.slow
async def test_cascade_answers_from_the_openai_cloud_with_costs(base_url, local_engine):  # noqa: F811
    question = [{"role": "user", "content": "Describe a cat in detail: its habits and its fur."}]
    async with OpenAICloudClient(base_url, api_key=KEY) as cloud:
        runner = CascadeRunner(local_engine, cloud, CascadeConfig())
        result = await runner.complete(question, GREEDY, model="cloud")
        direct = await drain(cloud.generate(question, GREEDY))
    routing = result.routing
    assert (routing.tier, routing.reason, routing.degraded) == ("cloud", "forced", False)
    assert set(result.tiers) == {"cloud"} and result.text == "".join(e.text for e in direct)
    assert routing.cost["cloud"]["prompt_tokens"] == direct[-1].num_prompt_tokens > 0
    # The server's own count, not the number of chunks (tokens with no text send none).
    assert routing.cost["cloud"]["completion_tokens"] == direct[-1].num_output_tokens >= len(result.token_ids) > 0
    assert "local" not in routing.cost


async def test_repetition_stop_asked_over_http_comes_back_as_stop_reason(client):
    asked = SamplingParams(max_tokens=400, temperature=0.0, repetition_stop=True)
    events = await drain(client.generate("w5 w6 w7 w8", asked, model="tiny"))
    assert (events[-1].finish_reason, events[-1].stop_reason) == ("length", "repetition") and len(events) < 400
    events = await drain(client.generate("w5 w6 w7 w8", SamplingParams(max_tokens=400, temperature=0.0), model="tiny"))
    assert events[-1].stop_reason is None  # the cloud engine's default: off
