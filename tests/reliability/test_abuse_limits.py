"""Abuse limits of the HTTP API against a real `tandem serve` (the embedded SmolLM2, device only):
body size, prompt length, max_tokens, n, stop, requests in flight per key; slow SSE readers;
clients that vanish at any point. Every refusal must be in OpenAI's error shape."""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import httpx
import openai
import pytest

from sdk.protocol.openai_schema import MAX_CHOICES, MAX_STOP_STRINGS
from tests.app_helpers import make_app
from sdk.openai_server.limits import DEFAULT_MAX_BODY_BYTES
from sdk.serving.client_limits import InFlightLimiter
from tests.conftest import running_server
from tests.sdk.test_openai_server import CHAT, MODEL, FakeEngine, metric

pytestmark = pytest.mark.slow

KEYS = ["sk-abuse-a-000000000000", "sk-abuse-b-111111111111", "sk-abuse-c-222222222222", "sk-abuse-d-333333333333"]
MAX_BODY = 64 * 1024
MAX_IN_FLIGHT = 2
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("abuse")
    (folder / "keys").write_text("\n".join(KEYS) + "\n")
    args = [
        "serve",
        "--cloud",
        "none",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-tokens",
        "4096",
        "--threads",
        "1",
        "--log-level",
        "warning",
        "--api-key-file",
        str(folder / "keys"),
        "--max-body-bytes",
        str(MAX_BODY),
        "--max-concurrent-per-key",
        str(MAX_IN_FLIGHT),
    ]
    with running_server(args, folder / "server.log") as (_, base_url):
        yield base_url


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def metrics_text(base_url: str) -> str:
    return httpx.get(f"{base_url}/metrics", headers=auth(KEYS[3])).text


def idle(base_url: str, timeout_s: float = 30.0) -> str:
    """tests.sdk.test_openai_server.wait_until_idle, with a key."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = metrics_text(base_url)
        if metric(text, "tandem:kv_blocks_used") == 0 and metric(text, "tandem:num_requests_running") == 0:
            return text
        if time.monotonic() > deadline:
            pytest.fail(
                "the engine is not idle:\n"
                + "\n".join(l for l in text.splitlines() if l.startswith("tandem:kv_blocks"))
            )
        time.sleep(0.1)


def assert_openai_error(
    response: httpx.Response,
    status: int,
    code: str | None,
    param: str | None = None,
    type_: str = "invalid_request_error",
) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert (error["type"], error["code"], error["param"]) == (type_, code, param), error
    assert error["message"]
    return error["message"]


# -- body size --------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_however_it_is_sent(server):
    big = {"model": MODEL, "messages": [{"role": "user", "content": "word " * (MAX_BODY // 4)}]}
    message = assert_openai_error(
        httpx.post(f"{server}/v1/chat/completions", json=big, headers=auth()), 413, "request_too_large"
    )
    assert str(MAX_BODY) in message
    # Chunked (no Content-Length): counted as it arrives.
    payload = json.dumps(big).encode()

    def chunks():
        for at in range(0, len(payload), 8192):
            yield payload[at : at + 8192]

    chunked = httpx.post(
        f"{server}/v1/completions", content=chunks(), headers={**auth(), "content-type": "application/json"}
    )
    assert (
        "transfer-encoding" not in chunked.request.headers or chunked.request.headers["transfer-encoding"] == "chunked"
    )
    assert_openai_error(chunked, 413, "request_too_large")
    # A huge declared length is refused from the headers alone: the body is never sent here.
    with socket.create_connection(("127.0.0.1", httpx.URL(server).port), timeout=10) as sock:
        sock.sendall(_head("POST", "/v1/chat/completions", KEYS[0], content_length=10 * 1024**3))
        answer = b""
        while chunk := sock.recv(65536):  # the server closes the connection after it
            answer += chunk
    head, _, body_text = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413") and "connection: close" in head.lower()
    assert json.loads(body_text)["error"]["code"] == "request_too_large"
    # The unauthenticated are refused before their body is looked at.
    assert httpx.post(f"{server}/v1/chat/completions", json=big).status_code == 401
    assert metric(metrics_text(server), "tandem:http_rejections_total", '{reason="too_large"}') >= 3


def test_a_body_under_the_limit_reaches_the_context_check(server):
    # ~60 KB of text: under the byte limit, far over the 512-token context: 400 naming the lengths.
    long_chat = {"model": MODEL, "messages": [{"role": "user", "content": "cat " * 15000}]}
    assert len(json.dumps(long_chat)) < MAX_BODY
    message = assert_openai_error(
        httpx.post(f"{server}/v1/chat/completions", json=long_chat, headers=auth()),
        400,
        "context_length_exceeded",
        "messages",
    )
    assert str(MAX_MODEL_LEN) in message
    completion = {"model": MODEL, "prompt": "cat " * 15000, "max_tokens": 4}
    response = httpx.post(f"{server}/v1/completions", json=completion, headers=auth())
    message = assert_openai_error(response, 400, "context_length_exceeded", "prompt")  # the prompt alone is over
    # 60,000 bytes are at least 740 tokens whatever the tokenizer does: refused before tokenizing.
    assert str(MAX_MODEL_LEN) in message and "at least" in message
    # 20,000 bytes pass that bound (>= 246 tokens) but tokenize to 5,001: the exact count is named.
    response = httpx.post(f"{server}/v1/completions", json={**completion, "prompt": "cat " * 5000}, headers=auth())
    message = assert_openai_error(response, 400, "context_length_exceeded", "prompt")
    assert str(MAX_MODEL_LEN) in message and "5001" in message


# -- the schema's limits ------------------------------------------------------------------------

SHORT = {"model": MODEL, "prompt": "The sky is", "max_tokens": 2}


@pytest.mark.parametrize(
    "path, body, code, param",
    [
        ("/v1/completions", {**SHORT, "max_tokens": 100_000}, "context_length_exceeded", "max_tokens"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": CHAT, "max_completion_tokens": 100_000},
            "context_length_exceeded",
            "max_tokens",
        ),
        ("/v1/completions", {**SHORT, "n": MAX_CHOICES + 1}, None, "n"),
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "n": MAX_CHOICES + 1}, None, "n"),
        ("/v1/completions", {**SHORT, "stop": ["x"] * (MAX_STOP_STRINGS + 1)}, None, "stop"),
        ("/v1/completions", {**SHORT, "logprobs": 6}, None, "logprobs"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": CHAT, "top_logprobs": 21, "logprobs": True},
            None,
            "top_logprobs",
        ),
    ],
    ids=["max-tokens", "chat-max-completion-tokens", "n", "chat-n", "stop", "logprobs", "top-logprobs"],
)
def test_request_limits_are_400s_in_openai_shape(server, path, body, code, param):
    response = httpx.post(f"{server}{path}", json=body, headers=auth())
    if param == "max_tokens" and response.json()["error"]["param"] == "max_completion_tokens":
        param = "max_completion_tokens"  # either name is a clear pointer
    assert_openai_error(response, 400, code, param)


def test_limits_at_their_maximum_are_served(server):
    body = {**SHORT, "n": 2, "stop": [f"zz{i}" for i in range(MAX_STOP_STRINGS)], "max_tokens": 2}
    response = httpx.post(f"{server}/v1/completions", json=body, headers=auth(), timeout=120)
    assert response.status_code == 200 and len(response.json()["choices"]) == 2


# -- requests in flight per key -------------------------------------------------------------------


def _long_stream(**extra) -> dict:
    # ignore_eos keeps it generating far longer than the test needs unless it is cancelled.
    return {"model": MODEL, "messages": CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True, **extra}


def test_in_flight_streams_per_key_are_capped_and_released(server):
    with httpx.Client(base_url=server, timeout=120) as http:
        with http.stream("POST", "/v1/chat/completions", json=_long_stream(), headers=auth()) as first:
            first_lines = first.iter_lines()
            assert next(first_lines).startswith("data: ")
            with http.stream(
                "POST",
                "/v1/completions",
                json={**SHORT, "max_tokens": 400, "ignore_eos": True, "stream": True},
                headers=auth(),
            ) as second:
                second_lines = second.iter_lines()
                assert next(second_lines).startswith("data: ")
                # A third, streaming or not, is 429 at once.
                for body in (_long_stream(), {**SHORT}):
                    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                    refused = http.post(path, json=body, headers=auth())
                    message = assert_openai_error(refused, 429, "concurrency_limit_exceeded", type_="requests")
                    assert f"at most {MAX_IN_FLIGHT}" in message and refused.headers["retry-after"] == "1"
                with pytest.raises(openai.RateLimitError):  # what the official client raises
                    openai.OpenAI(base_url=f"{server}/v1", api_key=KEYS[0], max_retries=0).completions.create(**SHORT)
                # Another key has its own slots; /metrics and /health are never counted.
                assert http.post("/v1/completions", json=SHORT, headers=auth(KEYS[1])).status_code == 200
                assert http.get("/metrics", headers=auth()).status_code == 200
                assert http.get("/health").status_code == 200
        # Both streams were abandoned mid-way: their slots come back as soon as the server sees it.
        deadline = time.monotonic() + 15
        while (response := http.post("/v1/completions", json=SHORT, headers=auth())).status_code == 429:
            assert time.monotonic() < deadline, "the slots of closed streams were never released"
            time.sleep(0.1)
        assert response.status_code == 200
    text = idle(server)
    assert metric(text, "tandem:http_rejections_total", '{reason="too_many_in_flight"}') >= 3


def test_in_flight_slots_survive_errors_and_are_per_client_address_without_keys():
    """In-process: a request that fails (400, 500) or finishes gives its slot back; without
    keys the client address is the identity."""
    import asyncio

    async def run():
        app = make_app(FakeEngine(), max_concurrent_per_key=1)
        limiter: InFlightLimiter = app.state.in_flight
        for ip in ("10.0.0.1", "10.0.0.2"):
            transport = httpx.ASGITransport(app=app, client=(ip, 1234))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                for body in (
                    {"messages": CHAT, "n": 99},
                    {"messages": CHAT},
                    {"messages": CHAT, "stream": True},
                    {"messages": 3},
                ):
                    await http.post("/v1/chat/completions", json=body)
                    assert limiter.total == 0
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            assert (await http.get("/health")).status_code == 200
        return app

    app = asyncio.run(run())
    assert app.state.in_flight.total == 0
    assert DEFAULT_MAX_BODY_BYTES == 4 * 1024 * 1024
    from sdk.settings.fields import FIELDS

    assert (
        DEFAULT_MAX_BODY_BYTES
        == FIELDS["server.max_body_bytes"].default
        == FIELDS["cloud_server.max_body_bytes"].default
    )
    assert FIELDS["server.max_concurrent_per_key"].default is None


# -- slow readers and vanishing clients ------------------------------------------------------------


def _head(method: str, path: str, key: str, content_length: int | None = None) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: test",
        f"Authorization: Bearer {key}",
        "Content-Type: application/json",
    ]
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _request(path: str, body: dict, key: str) -> bytes:
    payload = json.dumps(body).encode()
    return _head("POST", path, key, len(payload)) + payload


def _fast_streams(server: str, num: int, key: str) -> float:
    """Seconds until `num` concurrent 48-token streams have all finished."""
    done: list[float] = []
    start = time.monotonic()

    def one(i: int) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Count to {i + 3}."}],
            "max_tokens": 48,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{server}/v1/chat/completions", json=body, headers=auth(key), timeout=120
        ) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        done.append(time.monotonic())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(num)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(done) == num
    return max(done) - start


def test_a_slow_sse_reader_does_not_stall_other_streams(server):
    alone_s = _fast_streams(server, 2, KEYS[1])
    # The slow client: a tiny receive window, and one read of 512 bytes a second. Its chunks
    # carry 20 alternatives each (~2 KB), so the server's socket buffers fill and its writes block.
    slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", httpx.URL(server).port))
    body = _long_stream(max_tokens=300, logprobs=True, top_logprobs=20)
    slow.sendall(_request("/v1/chat/completions", body, KEYS[0]))
    received = bytearray(slow.recv(512))
    assert received.startswith(b"HTTP/1.1 200")
    stop = threading.Event()

    def read_slowly() -> None:
        while not stop.wait(1.0):
            try:
                chunk = slow.recv(512)
            except OSError:
                return
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    try:
        with_slow_s = _fast_streams(server, 2, KEYS[1])
        # Generous: the slow request shares the engine's steps, so the others may be somewhat slower, never stuck.
        assert with_slow_s < 3 * alone_s + 5, (alone_s, with_slow_s)
        # The engine is done with the slow request too (its blocks are free) while its client is still reading.
        idle(server, timeout_s=60)
        assert b"[DONE]" not in received, "the slow reader was not slow: nothing was held back for it"
    finally:
        stop.set()
        slow.close()
        reader.join()
    idle(server)


def _vanish(port: int, rng: random.Random, key: str) -> str:
    """One client that goes away at a random point; returns where."""
    stream = rng.random() < 0.5
    body = _long_stream() if stream else {**_long_stream(), "stream": False}
    path = rng.choice(["/v1/chat/completions", "/v1/completions"])
    if path == "/v1/completions":
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": stream}
    request = _request(path, body, key)
    where = rng.choice(["headers", "body", "before-response", "mid-stream", "waiting"])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        if where == "headers":  # part of the request line and headers
            sock.sendall(request[: rng.randrange(1, request.index(b"\r\n\r\n"))])
        elif where == "body":  # all headers, part of the body
            sock.sendall(request[: rng.randrange(request.index(b"\r\n\r\n") + 4, len(request))])
        elif where == "before-response":
            sock.sendall(request)
        elif where == "mid-stream" and stream:
            sock.sendall(request)
            wanted, got = rng.randrange(100, 6000), 0
            while got < wanted and (chunk := sock.recv(wanted - got)):
                got += len(chunk)
        else:  # a whole request, then gone after a while (before the whole answer is in)
            sock.sendall(request)
            time.sleep(rng.uniform(0.0, 1.5))
        time.sleep(rng.uniform(0.0, 0.2))
    return f"{where}:{'stream' if stream else 'whole'}:{path}"


def test_clients_vanishing_at_random_points_free_everything(server):
    port = httpx.URL(server).port
    rng = random.Random(20240611)
    seen = []
    aborted_before = metric(metrics_text(server), "tandem:num_requests_aborted_total")
    for round_ in range(6):
        # Two at a time per key, on two keys: up to the in-flight limit, never over it.
        threads = []
        for i in range(4):
            rounds_rng = random.Random(rng.random())
            key = KEYS[i % 2 + 2]
            threads.append(threading.Thread(target=lambda r=rounds_rng, k=key: seen.append(_vanish(port, r, k))))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(seen) == 24 and len({s.split(":")[0] for s in seen}) >= 4, seen
    text = idle(server, timeout_s=60)
    assert metric(text, "tandem:num_requests_waiting") == 0
    # The engine saw each disconnect that came after its request was running: every client gone
    # mid-stream at least (it read part of the answer), none that left during its headers or body.
    aborted = metric(text, "tandem:num_requests_aborted_total") - aborted_before
    mid_stream = sum(s.startswith("mid-stream:stream") for s in seen)
    reached = sum(s.split(":")[0] in ("before-response", "mid-stream", "waiting") for s in seen)
    assert mid_stream >= 1 and mid_stream <= aborted <= reached, (aborted, seen)
    # Every in-flight slot came back: each key may run its two requests again at once.
    with httpx.Client(base_url=server, timeout=120) as http:
        for key in KEYS[2:]:
            responses = []
            threads = [
                threading.Thread(
                    target=lambda: responses.append(http.post("/v1/completions", json=SHORT, headers=auth(key)))
                )
                for _ in range(MAX_IN_FLIGHT)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert [r.status_code for r in responses] == [200] * MAX_IN_FLIGHT, [r.text for r in responses]
    idle(server)


# -- configuration -------------------------------------------------------------------------------


def test_the_limits_are_settings_flags_and_env_vars(tmp_path):
    from sdk.settings import SettingsError, load_settings

    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    defaults = load_settings(env=env)
    assert (
        defaults.get("server.max_body_bytes") == DEFAULT_MAX_BODY_BYTES
        and defaults.get("server.max_concurrent_per_key") is None
    )
    config = tmp_path / "c.toml"
    config.write_text("[server]\nmax_body_bytes = 100000\nmax_concurrent_per_key = 3\n")
    layered = load_settings(
        str(config), env=env | {"TANDEM_MAX_CONCURRENT_PER_KEY": "5"}, cli={"server.max_body_bytes": 2048}
    )
    assert layered.get("server.max_body_bytes") == 2048 and layered.get("server.max_concurrent_per_key") == 5
    for key, value in [("max_body_bytes", 10), ("max_concurrent_per_key", 0)]:
        config.write_text(f"[server]\n{key} = {value}\n")
        with pytest.raises(SettingsError, match=key):
            load_settings(str(config), env=env)
    with pytest.raises(ValueError, match="max_body_bytes"):
        make_app(FakeEngine(), max_body_bytes=0)
    with pytest.raises(ValueError, match="max_concurrent_per_key"):
        make_app(FakeEngine(), max_concurrent_per_key=0)
    from typer.testing import CliRunner

    from sdk.cli.app import app

    for command in (["serve", "--help"], ["cloud", "serve", "--help"]):
        out = CliRunner().invoke(app, command, env={"COLUMNS": "300"}).output
        assert "--max-body-bytes" in out and "--max-concurrent-per-key" in out, out
