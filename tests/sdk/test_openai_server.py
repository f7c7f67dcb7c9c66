"""The OpenAI-compatible server: against a real `tandem serve` with the official client, and
the plumbing above the engines (loading, overload, crashes, disconnects) with a fake engine."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest

from sdk.protocol.engine import (
    ContextLengthError,
    EngineNotReadyError,
    EngineOverloadedError,
    EngineProtocol,
    EngineStats,
    GenerationRequest,
    TokenEvent,
    TopLogprob,
)
from tests.app_helpers import make_app

MODEL = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "Name three colours."}]
METRIC_NAMES = [
    "tandem:num_requests_running",
    "tandem:num_requests_waiting",
    "tandem:kv_cache_usage_perc",
    "tandem:kv_blocks_used",
    "tandem:kv_blocks_total",
    "tandem:prompt_tokens_total",
    "tandem:generation_tokens_total",
    "tandem:num_preemptions_total",
    "tandem:prefix_cache_hits_total",
    "tandem:prefix_cache_queries_total",
    "tandem:time_to_first_token_seconds_bucket",
    "tandem:inter_token_latency_seconds_bucket",
    "tandem:e2e_request_latency_seconds_bucket",
    "tandem:request_success_total",
]


@pytest.fixture(scope="module")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)


def metric(text: str, name: str, labels: str = "", default: float | None = None) -> float:
    """One sample's value; a missing sample fails the test unless a default is given."""
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    if match is None:
        assert default is not None, f"{name}{labels} is not in /metrics"
        return default
    return float(match.group(1))


def wait_until_idle(server_url: str, timeout_s: float = 10.0, engine: str = "") -> str:
    """Poll /metrics until no request runs and no KV block is held; return the last scrape.
    `engine`: the gauges' subsystem, "cloud_engine_" for tandem serve's embedded cloud engine."""
    prefix = "tandem:" + engine
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(f"{server_url}/metrics").text
        if metric(text, prefix + "kv_blocks_used") == 0 and metric(text, prefix + "num_requests_running") == 0:
            return text
        if time.monotonic() > deadline:
            pytest.fail(
                f"blocks still held after {timeout_s}s:\n"
                + "\n".join(
                    line
                    for line in text.splitlines()
                    if line.startswith((prefix + "kv_blocks", prefix + "num_requests"))
                )
            )
        time.sleep(0.1)


# -- the real server ---------------------------------------------------------------------------


@pytest.mark.slow
def test_chat_completion_matches_its_stream(client):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion" and whole.model == MODEL
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = whole.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # greedy: the stream says exactly what the whole answer said
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == usage.model_dump()


@pytest.mark.slow
def test_completion_matches_its_stream(client):
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert whole.usage.completion_tokens == 8 and whole.choices[0].finish_reason == "length"
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 8

    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="The capital of France is",
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


@pytest.mark.slow
def test_completion_takes_token_ids(client):
    out = client.completions.create(model=MODEL, prompt=[504, 3575, 282], max_tokens=4, temperature=0)
    assert out.usage.prompt_tokens == 3 and out.usage.completion_tokens == 4


@pytest.mark.slow
def test_chat_logprobs_list_the_asked_alternatives(client):
    out = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, logprobs=True, top_logprobs=3, temperature=0
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert max(alt.logprob for alt in entry.top_logprobs) >= entry.logprob - 1e-6  # greedy took the best
        assert isinstance(entry.bytes, list)


@pytest.mark.slow
def test_completion_logprobs_use_the_legacy_columns(client):
    out = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=6, logprobs=2, temperature=0)
    logprobs = out.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == 6
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(2 <= len(top) <= 3 for top in logprobs.top_logprobs)  # the chosen token is always listed
    assert logprobs.text_offset == sorted(logprobs.text_offset)


@pytest.mark.slow
def test_stop_string_is_cut_from_the_output(client):
    prompt = "Count: 1, 2, 3, 4, 5,"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    words = free.split()
    assert len(words) >= 3, free
    stop = words[2]
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop, "zzz"])
    text = stopped.choices[0].text
    assert stop not in text and stopped.choices[0].finish_reason == "stop"
    assert free.startswith(text)


@pytest.mark.slow
def test_a_loop_ends_with_stop_reason_repetition_unless_the_request_opts_out(client):
    body = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a poem about the sea."}],
        max_tokens=400,
        temperature=0,
    )
    whole = client.chat.completions.create(**body)
    choice = whole.choices[0]
    assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("length", "repetition")
    assert whole.usage.completion_tokens < 400
    last = [c for c in client.chat.completions.create(**body, stream=True) if c.choices and c.choices[0].finish_reason][
        -1
    ]
    assert (last.choices[0].finish_reason, last.choices[0].model_extra["stop_reason"]) == ("length", "repetition")
    kept = client.chat.completions.create(**body, extra_body={"repetition_stop": False})
    assert kept.choices[0].model_extra["stop_reason"] is None and kept.usage.completion_tokens == 400
    assert kept.choices[0].message.content.startswith(choice.message.content)


@pytest.mark.slow
def test_seed_makes_sampling_reproducible_in_batch_invariant_mode(server_url):
    """By default a repeated request copies its cached prompt and its new cells land wherever earlier
    requests left room; llama.cpp's attention sums a sequence's cells in cell order (in f16 on CPU),
    so a seed is best effort, as OpenAI's is. --batch-invariant (the session server's mode) promises
    it, other requests between."""
    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def sample() -> str:
        out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=1.0, seed=1234)
        return out.choices[0].message.content

    first = sample()
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a poem about the sea."}],
        max_tokens=300,
        temperature=0.0,
    )  # cells taken and freed in between
    assert sample() == first


@pytest.mark.slow
def test_n_choices_are_separate_requests(client):
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, n=2, temperature=1.0, seed=7)
    assert [c.index for c in out.choices] == [0, 1]
    assert 2 <= out.usage.completion_tokens <= 12  # both choices counted, the prompt once
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, n=2, stream=True))
    assert {c.choices[0].index for c in chunks} == {0, 1}


@pytest.mark.slow
async def test_32_concurrent_clients_all_finish(server_url):
    async with openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=300) as client:

        async def one(i: int):
            messages = [{"role": "user", "content": f"Say the number {i}."}]
            return await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)

        results = await asyncio.gather(*(one(i) for i in range(32)))
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in results)
    assert all(0 < r.usage.completion_tokens <= 8 for r in results)
    assert len({r.id for r in results}) == 32
    wait_until_idle(server_url)


def _long_chat(stream: bool) -> dict:
    # ignore_eos keeps it generating well past the test's 10 s budget unless it is cancelled.
    return {"model": MODEL, "messages": CHAT, "max_tokens": 450, "ignore_eos": True, "stream": stream}


@pytest.mark.slow
def test_client_killed_mid_stream_frees_its_blocks(server_url):
    abort = ("tandem:request_success_total", '{finished_reason="abort"}')
    before = metric(httpx.get(f"{server_url}/metrics").text, *abort, default=0.0)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server_url}/v1/chat/completions", json=_long_chat(stream=True)) as response:
            assert response.status_code == 200
            lines = response.iter_lines()  # keep it: dropping a half-read iterator closes the connection
            assert next(lines).startswith("data: ")
            assert metric(httpx.get(f"{server_url}/metrics").text, "tandem:num_requests_running") >= 1
    # Leaving both blocks closes the connection without reading the rest.
    text = wait_until_idle(server_url)
    assert metric(text, *abort) == before + 1  # cancelled, not finished


@pytest.mark.slow
def test_client_gone_before_a_whole_answer_frees_its_blocks(server_url):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server_url}/v1/chat/completions", json=_long_chat(stream=False), timeout=1.0)
    wait_until_idle(server_url)


BAD_CHATS = [
    pytest.param(b"{not json", 400, None, id="malformed-json"),
    pytest.param({"model": MODEL, "messages": CHAT, "temperature": "hot"}, 400, "temperature", id="wrong-type"),
    pytest.param({"model": MODEL, "messages": []}, 400, "messages", id="no-messages"),
    pytest.param({"model": MODEL, "messages": CHAT, "temperature": 5}, 400, "temperature", id="temperature-5"),
    pytest.param({"model": MODEL, "messages": CHAT, "max_tokens": 0}, 400, "max_tokens", id="max-tokens-0"),
    pytest.param(
        {"model": MODEL, "messages": CHAT, "presence_penalty": 2.5}, 400, "presence_penalty", id="penalty-2.5"
    ),
    pytest.param({"model": MODEL, "messages": CHAT, "logit_bias": {"x": 1}}, 400, "logit_bias", id="logit-bias-key"),
    pytest.param(
        {"model": MODEL, "messages": CHAT, "logit_bias": {"99999999": 1}}, 400, "logit_bias", id="logit-bias-id"
    ),
    pytest.param(
        {"model": MODEL, "messages": CHAT, "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens", id="min-tokens"
    ),
    pytest.param({"model": MODEL, "messages": CHAT, "stop": ["x"] * 17}, 400, "stop", id="too-many-stops"),
    pytest.param({"model": MODEL, "messages": CHAT, "n": 100}, 400, "n", id="n-100"),
    pytest.param(
        {"model": MODEL, "messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content", id="content-int"
    ),
    pytest.param({"model": "gpt-9", "messages": CHAT}, 404, "model", id="unknown-model"),
]


@pytest.mark.slow
def test_routed_logit_bias_is_honoured_when_both_tiers_share_the_vocabulary(server_url, client):
    """tandem serve's embedded cloud engine serves the same GGUF: one vocabulary, so a routed
    request's logit_bias is taken (tests/sdk/test_cascade.py refuses it for another vocabulary)."""
    deadline = time.monotonic() + 120
    while httpx.get(f"{server_url}/health").json().get("cloud") == "loading":
        assert time.monotonic() < deadline, "the embedded cloud engine did not come up"
        time.sleep(0.5)
    cards = {card.id: card.model_extra for card in client.models.list().data}
    assert cards[MODEL]["vocabulary_fingerprint"] == cards["cloud"]["vocabulary_fingerprint"] != ""

    def answer(model: str, **extra) -> str:
        return (
            client.chat.completions.create(model=model, messages=CHAT, max_tokens=3, temperature=0, **extra)
            .choices[0]
            .message.content
        )

    bias = {"3681": 100}  # one token pushed far above every other: the answer is that token, three times
    direct, routed = answer(MODEL, logit_bias=bias), answer("auto", logit_bias=bias)
    piece = direct[: len(direct) // 3]
    assert routed == direct == piece * 3 and piece and direct != answer(MODEL)


@pytest.mark.slow
@pytest.mark.parametrize("body, status, param", BAD_CHATS)
def test_bad_chat_requests_get_openai_errors(server_url, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        f"{server_url}/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if status == 404:
        assert error["code"] == "model_not_found"


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_context_overflow_names_the_limits(client, stream):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=100_000, stream=stream)
    error = info.value.body
    assert info.value.code == "context_length_exceeded"
    assert "512" in error["message"] and "100000" in error["message"]


@pytest.mark.slow
def test_completion_refuses_what_it_cannot_do(client):
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model=MODEL, prompt="x", echo=True)
    with pytest.raises(openai.BadRequestError, match="one prompt"):
        client.completions.create(model=MODEL, prompt=["a", "b"])
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


@pytest.mark.slow
def test_health_models_and_metrics(server_url, client):
    assert httpx.get(f"{server_url}/health").json()["status"] == "ok"
    models = client.models.list().data
    # The routed names come first (tests/sdk/test_serve_cascade.py); MODEL is the engine itself.
    assert [m.id for m in models][-1] == MODEL and models[-1].owned_by == "tandem"
    text = httpx.get(f"{server_url}/metrics").text
    for name in METRIC_NAMES:
        assert re.search(rf"^{re.escape(name)}[{{ ]", text, re.M), name
    assert metric(text, "tandem:kv_blocks_total") == 4096 // 16


# -- above the engines: a fake engine --------------------------------------------------------------


class FakeEngine(EngineProtocol):
    """Just enough of EngineProtocol to drive the server: words out, one per event."""

    model_name = "fake"
    max_model_len = 64

    def __init__(
        self, words=("a", "b", "c"), error: Exception | None = None, delay_s: float = 0.0, prompt_len: int = 3
    ):
        self.ready = True
        self.prompt_len = prompt_len
        self.words = list(words)
        self.error = error
        self.delay_s = delay_s
        self.closed_ids: list[str] = []
        self.finished_ids: list[str] = []

    @property
    def is_ready(self) -> bool:
        return self.ready

    def tokenize(self, text, add_special=True):
        return [1] * max(1, len(text.split()))

    def apply_chat_template(self, messages):
        if not self.ready:
            raise EngineNotReadyError("still loading")
        return [1] * self.prompt_len

    async def generate(self, request: GenerationRequest):
        if self.error is not None:
            raise self.error
        try:
            for i, word in enumerate(self.words):
                await asyncio.sleep(self.delay_s)
                last = i == len(self.words) - 1
                yield TokenEvent(
                    request.request_id,
                    i,
                    word,
                    -0.5,
                    1.0,
                    0.1,
                    top_logprobs=[TopLogprob(i, word, -0.5)],
                    token_bytes=word.encode(),
                    finish_reason="length" if last else None,
                    num_prompt_tokens=len(request.prompt_token_ids),
                    num_output_tokens=i + 1,
                )
            self.finished_ids.append(request.request_id)
        finally:
            self.closed_ids.append(request.request_id)

    async def abort(self, request_id):
        pass

    def stats(self):
        return EngineStats(1, 0, 10, 2, 5, 6, 0, 0)


async def _post(app, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        return await http.post(path, json=body)


async def test_health_is_503_while_loading_then_200():
    engine = FakeEngine()
    engine.ready = False
    app = make_app(engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        loading = await http.get("/health")
        assert loading.status_code == 503 and loading.json()["error"]["code"] == "model_not_ready"
        chat = await http.post("/v1/chat/completions", json={"messages": CHAT})
        assert chat.status_code == 503 and chat.json()["error"]["type"] == "service_unavailable"
        assert "tandem:kv_blocks_used" not in (await http.get("/metrics")).text  # no numbers while loading
        engine.ready = True
        assert (await http.get("/health")).status_code == 200


@pytest.mark.parametrize(
    "error, status, code",
    [
        (EngineOverloadedError("queue full", retry_after_s=2.5), 503, "server_overloaded"),
        (ContextLengthError("too long", "max_tokens"), 400, "context_length_exceeded"),
        (RuntimeError("boom"), 500, None),
    ],
)
async def test_engine_errors_become_openai_errors(error, status, code):
    response = await _post(make_app(FakeEngine(error=error)), "/v1/chat/completions", {"messages": CHAT})
    assert response.status_code == status
    body = response.json()["error"]
    assert body["code"] == code and body["message"]
    if status == 503:
        assert response.headers["retry-after"] == "3"
    if status == 500:
        assert body["type"] == "server_error"


async def test_fake_engine_answers_in_both_formats_with_aliases():
    app = make_app(FakeEngine(), served_model_names=["alias-a", "alias-b"])
    chat = (await _post(app, "/v1/chat/completions", {"model": "alias-b", "messages": CHAT, "logprobs": True})).json()
    assert chat["model"] == "alias-b" and chat["choices"][0]["message"]["content"] == "abc"
    assert [e["token"] for e in chat["choices"][0]["logprobs"]["content"]] == ["a", "b", "c"]
    assert chat["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    completion = (await _post(app, "/v1/completions", {"prompt": "x y", "logprobs": 1})).json()
    assert completion["model"] == "alias-a" and completion["choices"][0]["logprobs"]["text_offset"] == [0, 1, 2]
    assert (await _post(app, "/v1/completions", {"model": "fake", "prompt": "x"})).status_code == 404


async def test_disconnected_stream_closes_the_engine_stream():
    """An ASGI-level client that reads one chunk and hangs up: the engine stream must be closed."""
    engine = FakeEngine(words=["w"] * 1000, delay_s=0.01)
    app = make_app(engine)
    hung_up = asyncio.Event()
    body = json.dumps({"messages": CHAT, "stream": True}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            hung_up.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    assert len(engine.closed_ids) == 1 and engine.finished_ids == []


async def test_chat_default_budget_is_what_the_context_leaves():
    full = await _post(make_app(FakeEngine(prompt_len=64)), "/v1/chat/completions", {"messages": CHAT})
    assert full.status_code == 400 and full.json()["error"]["code"] == "context_length_exceeded"
    assert "64" in full.json()["error"]["message"]
    fits = await _post(make_app(FakeEngine(prompt_len=63)), "/v1/chat/completions", {"messages": CHAT})
    assert fits.status_code == 200
