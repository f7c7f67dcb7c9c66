"""Fuzzing the OpenAI-compatible HTTP API on its two deployments, over real loopback HTTP:

- local: `tandem serve --cloud none` as a subprocess (the embedded SmolLM2 GGUF, the cascade's
  routed models auto/local/cloud and the model's own name), exactly what a user runs;
- hosted: the same app over the cloud engine on a tiny random-weight Llama (with a chat
  template, so chat requests reach the engine too), API keys on, served by uvicorn in a thread.

Thousands of hypothesis-generated requests per target (derandomized: the same ones in every
run): no 5xx (a 503 only with Retry-After), no request over REQUEST_TIMEOUT_S, every 4xx in
OpenAI's error shape, every 200 a valid OpenAI object or an SSE stream ending in [DONE]; and
afterwards both engines are idle with no KV block held. Both targets run with
max_model_len 128, so the most expensive valid request is bounded.
"""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import running_server, served_in_thread
from tests.reliability.fuzz_strategies import (
    BOUNDED_METADATA,
    OVER_BOUNDS,
    REQUEST_TIMEOUT_S,
    RequestCounter,
    chat_bodies,
    check_http_response,
    completion_bodies,
    encode_body,
    fuzz_settings,
    malformed_bodies,
    odd_text,
    responses_bodies,
    timed,
)

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 128
API_KEY = "fuzz-key-0123456789"
N_CHAT, N_COMPLETIONS, N_RESPONSES, N_MALFORMED = 900, 900, 300, 450  # per target; + the fixed huge-body cases
MIN_REQUESTS_PER_TARGET = 2000
SMOL_WORDS = [
    "Hello",
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "\n",
    "1",
    "2",
    "!",
    "Name",
    "three",
    "colours",
    "def",
    "(",
    "é",
    "日本",
]
TINY_WORDS = ["w5", "w6", "w7", "w8", "w42", "w299", "w300", "xx", "<s>", "</s>"]
TINY_TEMPLATE = (
    "{% for m in messages %}w5 {{ m['content'] }} w6 {% endfor %}{% if add_generation_prompt %}w7{% endif %}"
)

COUNTER = RequestCounter()


@dataclass
class Target:
    name: str
    base_url: str
    models: list[str]
    vocab_size: int
    words: list[str]
    headers: dict[str, str] = field(default_factory=dict)
    engine: object = None  # the in-process engine (hosted), for a direct stats check

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=REQUEST_TIMEOUT_S)


# -- targets ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_target(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("fuzz-serve") / "server.log"
    args = [
        "serve",
        "--cloud",
        "none",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-tokens",
        "2048",
        "--threads",
        "1",
        "--log-level",
        "warning",
    ]
    with running_server(args, log_path) as (process, base_url):
        models = [m["id"] for m in httpx.get(f"{base_url}/v1/models").json()["data"]]
        yield Target("local", base_url, models, 49152, SMOL_WORDS)
        assert process.poll() is None, "tandem serve died during the fuzz run"
        log_text = log_path.read_text(errors="replace")
        assert "Traceback" not in log_text, log_text[-5000:]


@pytest.fixture(scope="module")
def hosted_target(tmp_path_factory):
    from cloud_engine.async_engine import AsyncCloudEngine
    from cloud_engine.config import CloudEngineConfig
    from tests.app_helpers import make_app
    from sdk.response_store.sqlite_store import SQLiteResponseStore
    from tests.cloud_engine.tiny_models import VOCAB_SIZE, save_tiny_llama

    path = save_tiny_llama(tmp_path_factory.mktemp("fuzz-tiny-llama"))
    config_path = Path(path) / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": TINY_TEMPLATE}))

    engine = AsyncCloudEngine(
        CloudEngineConfig(
            model=str(path),
            model_name="tiny",
            dtype="float32",
            block_size=4,
            kv_cache_gb=0.002,
            max_model_len=MAX_MODEL_LEN,
        )
    ).start()
    engine.wait_ready(120)
    # The fuzzer sends wrong and missing keys from this one address on purpose; the auth backoff
    # (tests/sdk/test_openai_auth.py) would then refuse its valid requests unchecked.
    store = SQLiteResponseStore(Path(path) / "responses.sqlite3")  # previous_response_id and storing fuzzed too
    app = make_app(engine, api_keys=frozenset({API_KEY}), auth_backoff_after=0, response_store=store)
    try:
        with served_in_thread(app, "fuzz-uvicorn") as url:
            yield Target(
                "hosted",
                url,
                ["tiny"],
                VOCAB_SIZE,
                TINY_WORDS,
                headers={"Authorization": f"Bearer {API_KEY}"},
                engine=engine,
            )
    finally:
        engine.shutdown()


@pytest.fixture(scope="module", params=["local", "hosted"])
def target(request) -> Target:
    return request.getfixturevalue(f"{request.param}_target")


# -- helpers ---------------------------------------------------------------------------------------


def send(
    client: httpx.Client,
    target: Target,
    method: str,
    path: str,
    content: bytes | None = None,
    headers: dict | None = None,
) -> httpx.Response:
    """One request, counted; a transport error or a hang fails the test."""
    COUNTER.add(target.name)
    response, _ = timed(lambda: client.request(method, path, content=content, headers=headers))
    return response


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


def assert_idle(target: Target, timeout_s: float = 15.0) -> None:
    """No request running or waiting, no KV block held (through /metrics, and the engine when in-process)."""
    deadline = time.monotonic() + timeout_s
    with target.client() as client:
        while True:
            text = client.get("/metrics").text
            values = [
                metric(text, n)
                for n in ("tandem:num_requests_running", "tandem:num_requests_waiting", "tandem:kv_blocks_used")
            ]
            if values == [0, 0, 0]:
                break
            assert time.monotonic() < deadline, (
                f"{target.name} not idle after the fuzz run: running/waiting/blocks = {values}"
            )
            time.sleep(0.1)
    if target.engine is not None:
        stats = target.engine.stats()
        assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0), stats


def post_json(client, target, path, body, ensure_ascii=True):
    response = send(client, target, "POST", path, encode_body(body, ensure_ascii), {"Content-Type": "application/json"})
    check_http_response(response, path)
    return response


# -- the fuzz runs -----------------------------------------------------------------------------------


def test_fuzz_chat_completions(target):
    with target.client() as client:

        @fuzz_settings(N_CHAT)
        @given(body=chat_bodies(target.models, MAX_MODEL_LEN, target.vocab_size), ensure_ascii=st.booleans())
        def run(body, ensure_ascii):
            post_json(client, target, "/v1/chat/completions", body, ensure_ascii)

        run()
    assert_idle(target)
    COUNTER.completed.add(f"chat-{target.name}")


def test_fuzz_completions(target):
    with target.client() as client:

        @fuzz_settings(N_COMPLETIONS)
        @given(
            body=completion_bodies(target.models, MAX_MODEL_LEN, target.vocab_size, target.words),
            ensure_ascii=st.booleans(),
        )
        def run(body, ensure_ascii):
            post_json(client, target, "/v1/completions", body, ensure_ascii)

        run()
    assert_idle(target)
    COUNTER.completed.add(f"completions-{target.name}")


def test_fuzz_responses(target):
    with target.client() as client:

        @fuzz_settings(N_RESPONSES)
        @given(body=responses_bodies(target.models, MAX_MODEL_LEN), ensure_ascii=st.booleans())
        def run(body, ensure_ascii):
            post_json(client, target, "/v1/responses", body, ensure_ascii)

        run()
    assert_idle(target)
    COUNTER.completed.add(f"responses-{target.name}")


def test_responses_bounds_are_400s_naming_the_field(target):
    """Each bound of POST /v1/responses once, on both deployments: past it, a 400 naming the field before
    anything runs; at it (metadata of 16 pairs at full length, a 64-character user), answered and stored."""
    with target.client() as client:
        base = {"model": target.models[-1], "input": "Hello", "max_output_tokens": 2}
        for fields, param in OVER_BOUNDS:
            response = post_json(client, target, "/v1/responses", {**base, **fields})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text[:500]
        at_bounds = {**base, "metadata": BOUNDED_METADATA[0], "user": "u" * 64}
        answered = post_json(client, target, "/v1/responses", at_bounds)
        assert answered.status_code == 200 and answered.json()["store"] is True, answered.text[:500]
        stored = send(client, target, "GET", f"/v1/responses/{answered.json()['id']}")
        assert stored.status_code == 200 and stored.json()["metadata"] == BOUNDED_METADATA[0]
    assert_idle(target)


PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/models",
    "/health",
    "/v1/responses/resp_0",
    "/v1/responses/" + "x" * 3000,
    "/metrics",
    "/v1/models/tiny",
    "/v1/models/auto",
    "/v1/models/%ff%fe",
    "/v1/models/" + "x" * 3000,
    "/v1/chat/completions/",
    "/v1/nope",
    "/",
    "/v1//completions",
    "/v1/models/../../etc/passwd",
]
CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/json; charset=latin-1",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    "garbage/x",
]


@st.composite
def raw_requests(draw, target: Target):
    """(method, path, headers, body): malformed bodies on the POST endpoints, odd methods and paths elsewhere."""
    models = target.models
    valid = draw(
        st.sampled_from(
            [
                {"model": models[-1], "prompt": "Hello", "max_tokens": 2},
                {"model": models[-1], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True},
                {"model": models[-1], "input": "hi", "max_output_tokens": 2, "stream": True},
            ]
        )
    )
    path = draw(st.sampled_from(PATHS[:3] * 4 + PATHS))
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
    headers = {}
    content_type = draw(st.sampled_from(CONTENT_TYPES))
    if content_type:
        headers["Content-Type"] = content_type
    if target.headers:  # the hosted API: mostly the right key, sometimes none, a wrong or a malformed one
        auth = draw(
            st.sampled_from(
                [target.headers["Authorization"]] * 6
                + [
                    None,
                    "Bearer",
                    "Bearer a b",
                    "Basic x",
                    f"bearer {API_KEY}",
                    f"Bearer {API_KEY} x",
                    b"Bearer \xff\xfe",
                    "Bearer wrong",
                ]
            )
        )
        headers["Authorization"] = auth if auth is not None else ""
    body = draw(malformed_bodies(valid)) if draw(st.integers(0, 3)) else draw(odd_text).encode("utf-8", "surrogatepass")
    return method, path, headers, body


def test_fuzz_malformed_requests(target):
    with target.client() as client:

        @fuzz_settings(N_MALFORMED)
        @given(request=raw_requests(target))
        def run(request):
            method, path, headers, body = request
            if headers.get("Authorization") == "":
                client_headers = {k: v for k, v in headers.items() if k != "Authorization"}
                # httpx merges the client's default auth header back in: send this one bare.
                with httpx.Client(base_url=target.base_url, timeout=REQUEST_TIMEOUT_S) as bare:
                    response = send(bare, target, method, path, body, client_headers)
            else:
                response = send(client, target, method, path, body, headers)
            check_http_response(response, path, method)

        run()
    assert_idle(target)
    COUNTER.completed.add(f"malformed-{target.name}")


def test_huge_bodies(target):
    """A few MB of prompt, of message content, of token ids, of garbage: each refused (or answered) promptly."""
    model = target.models[-1]
    cases = [
        ("/v1/completions", {"model": model, "prompt": "Hello " * 700_000, "max_tokens": 1}, 400),
        ("/v1/completions", {"model": model, "prompt": [5] * 1_000_000, "max_tokens": 1}, 400),
        # Long stop strings are allowed (OpenAI limits their number, not their length).
        ("/v1/completions", {"model": model, "prompt": "x", "max_tokens": 1, "stop": ["y" * 1_000_000] * 4}, 200),
        (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "é" * 2_000_000}], "max_tokens": 1},
            400,
        ),
        (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi"}] * 2_000, "max_tokens": 1},
            400,
        ),
    ]
    with target.client() as client:
        for path, body, status in cases:
            response = post_json(client, target, path, body)
            # 413: a server with a body size limit refuses a body over it before parsing.
            assert response.status_code == status or (status == 400 and response.status_code == 413), response.text[
                :500
            ]
        garbage = bytes(range(256)) * 16_384  # 4 MiB
        response = send(client, target, "POST", "/v1/chat/completions", garbage, {"Content-Type": "application/json"})
        check_http_response(response, "/v1/chat/completions")
        assert response.status_code in (400, 413)
    assert_idle(target)


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-40, 1e-6])
def test_tiny_positive_temperature_is_greedy_not_a_500(hosted_target, temperature):
    """Regression (found by this fuzzer): temperature 1e-320 overflowed the cloud sampler's logits
    to inf, torch.multinomial raised on NaN probabilities, and the request got a 500."""
    body = {"model": "tiny", "prompt": "w5 w6", "max_tokens": 3, "temperature": temperature, "stream": False}
    with hosted_target.client() as client:
        greedy = post_json(client, hosted_target, "/v1/completions", {**body, "temperature": 0}).json()
        response = post_json(client, hosted_target, "/v1/completions", body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == greedy["choices"][0]["text"]
        chat = post_json(
            client, hosted_target, "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "w5"}]}
        )
        assert chat.status_code == 200, chat.text
    assert_idle(hosted_target)


def test_many_messages_are_refused_before_tokenizing(local_target):
    # llama.cpp's special-token pass grows faster than linearly: 100k small messages used to hold the
    # event loop past 30 s. The engine now refuses a rendered prompt that cannot fit from its byte count.
    body = {
        "model": local_target.models[-1],
        "messages": [{"role": "user", "content": "hi"}] * 100_000,
        "max_tokens": 1,
    }
    with local_target.client() as client:
        start = time.monotonic()
        response = post_json(client, local_target, "/v1/chat/completions", body)
        assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
        assert time.monotonic() - start < 10.0, f"{time.monotonic() - start:.1f}s: the server hung on 100k messages"


def test_truncated_and_abandoned_requests(target):
    """Raw sockets: a body shorter than its Content-Length, a stream read halfway then dropped,
    a half-sent header; the server frees everything and keeps serving."""
    host, port = target.base_url.removeprefix("http://").split(":")
    auth = "".join(f"{k}: {v}\r\n" for k, v in target.headers.items())
    body = json.dumps(
        {
            "model": target.models[-1],
            "prompt": "Hello",
            "max_tokens": MAX_MODEL_LEN - 8,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    requests = [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth.encode() + b'Content-Length: 1000\r\n\r\n{"prompt":',
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
        + auth.encode()
        + b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len",
        b"GARBAGE\r\n\r\n",
    ]
    for raw in requests:
        COUNTER.add(target.name)
        with socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S) as sock:
            sock.sendall(raw)
            if b"stream" in raw:
                sock.recv(4096)  # the stream has started: now leave
            time.sleep(0.05)
    with target.client() as client:
        response = post_json(
            client, target, "/v1/completions", {"model": target.models[-1], "prompt": "Hello", "max_tokens": 2}
        )
        assert response.status_code == 200, response.text
    assert_idle(target)


def test_counts(target):
    """Prints the requests sent; with every fuzz test of this target run, at least MIN_REQUESTS_PER_TARGET."""
    sent = COUNTER.counts.get(target.name, 0)
    print(f"\nfuzzed HTTP requests to {target.name}: {sent}")
    if {f"{kind}-{target.name}" for kind in ("chat", "completions", "responses", "malformed")} <= COUNTER.completed:
        assert sent >= MIN_REQUESTS_PER_TARGET, sent
    with target.client() as client:  # still serving
        assert client.get("/health").status_code == 200
    assert_idle(target)
