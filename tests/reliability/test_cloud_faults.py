"""The cascade over the real local engine (embedded SmolLM2) when its cloud misbehaves.

The cloud is ours on loopback: a real grpc.aio server implementing tandem.v1 whose
behaviour each test scripts (stream k tokens, stall, abort with a code, drop the whole
server part-way), plain TCP servers that are not gRPC at all, and a raw HTTP/1 server for
the OpenAI-compatible client that answers whatever bytes the test gives it (malformed JSON,
wrong shapes, truncated SSE, undecodable bodies). For every fault the request still
answers: tier local, `degraded`, a specific `degraded_reason`, no exception to the caller,
and the local engine ends idle with no KV block held. Then recovery: once the breaker has
opened, a cloud that comes back gets escalations again after the cool-down.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.cloud_backend import CloudBackend, CloudTokenEvent
from sdk.protocol.wire import tandem_pb2_grpc as pb_grpc
from local_runtime.async_engine import AsyncLocalEngine
from local_runtime.config import LocalEngineConfig
from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk.cloud.grpc_client import CloudClient, CloudError
from sdk.protocol.engine import SamplingParams
from sdk.cloud.openai_client import OpenAICloudClient
from tests.conftest import free_port

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
PARAMS = SamplingParams(max_tokens=10, temperature=0.0)
CLOUD_WORDS = [f" cloud{i}" for i in range(PARAMS.max_tokens)]


@pytest.fixture(scope="module")
def local_engine():
    config = LocalEngineConfig(
        kv_cache_tokens=1024, max_num_seqs=2, max_num_batched_tokens=128, max_model_len=512, n_threads=1
    )
    engine = AsyncLocalEngine(config).start()
    engine.wait_ready(180)
    yield engine
    engine.shutdown()


async def assert_idle(engine, timeout_s: float = 5.0) -> None:
    """No request running or waiting and no KV block held (aborts reach the engine thread asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.num_kv_blocks_used == 0:
            return
        assert time.monotonic() < deadline, f"the local engine did not go idle: {stats}"
        await asyncio.sleep(0.02)


async def answer(runner: CascadeRunner, model: str = "cloud", params: SamplingParams = PARAMS):
    """The whole streamed answer: (events before the final one, the final one). Never raises."""
    events = [event async for event in runner.generate(QUESTION, params, model=model)]
    assert events and events[-1].routing is not None
    return events[:-1], events[-1]


def assert_degraded_local_answer(tokens, final, reason: str) -> None:
    routing = final.routing
    assert (routing.tier, routing.degraded, routing.degraded_reason) == ("local", True, reason), routing
    assert final.finish_reason in ("stop", "length")
    local = [e for e in tokens if e.tier == "local"]
    assert local and "".join(e.text for e in local).strip(), "the local tier answered"
    assert final.finish_reason == "stop" or len(tokens) == PARAMS.max_tokens  # a whole answer


# -- a tandem.v1 server we control ---------------------------------------------------------------


class FakeCloud(pb_grpc.TandemServicer):
    """tandem.v1 with scripted behaviour. mode: "ok" streams `num_tokens` words; "abort"
    aborts with `abort_code` before any token; "stall" streams `cut_after` tokens then
    sleeps `stall_s`; "kill" streams `cut_after` tokens then stops the whole server; "slow"
    sends a token every `gap_s`. `num_cancelled` counts calls the client cancelled (what
    makes a real engine abort the request and free its KV blocks)."""

    def __init__(
        self,
        mode: str = "ok",
        *,
        cut_after: int = 3,
        stall_s: float = 30.0,
        gap_s: float = 0.01,
        abort_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
    ):
        self.mode, self.cut_after, self.stall_s, self.abort_code = mode, cut_after, stall_s, abort_code
        self.gap_s = gap_s
        self.num_calls = 0
        self.num_cancelled = 0
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()

    async def start(self, port: int = 0, serving: bool = True) -> int:
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_TandemServicer_to_server(self, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set("", status)
        port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None

    async def Generate(self, request, context):
        self.num_calls += 1
        if self.mode == "abort":
            await context.abort(self.abort_code, "scripted failure")
        try:
            async for response in self._responses(request):
                yield response
        except asyncio.CancelledError:
            self.num_cancelled += 1
            raise

    async def _responses(self, request):
        max_tokens = request.sampling.max_tokens or len(CLOUD_WORDS)
        for i in range(max_tokens):
            if self.mode in ("stall", "kill") and i == self.cut_after:
                if self.mode == "kill":
                    asyncio.get_running_loop().create_task(self.stop())
                await asyncio.sleep(self.stall_s)
            await asyncio.sleep(self.gap_s if self.mode == "slow" else 0.01)
            last = i == max_tokens - 1
            response = pb.GenerateResponse(
                request_id=request.request_id,
                token_id=i,
                text=CLOUD_WORDS[i % len(CLOUD_WORDS)],
                logprob=-0.1,
                finish_reason="length" if last else "",
            )
            if last:
                response.usage.prompt_tokens, response.usage.completion_tokens = 7, max_tokens
            yield response


class NotTandem:
    """A real gRPC server on the port that serves health only: tandem.v1 is UNIMPLEMENTED."""

    async def start(self) -> int:
        self.server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    async def stop(self) -> None:
        await self.server.stop(0)


class LoopbackTcpServer:
    """An asyncio TCP server on a free loopback port; subclasses answer in `_handle(reader, writer)`."""

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()  # black-holed connections end with the test's loop


class RawTcp(LoopbackTcpServer):
    """Not gRPC at all: each connection gets `payload` (random bytes, an HTTP/1 answer) and
    is closed after `hold_s`; payload None accepts and never answers (a black hole)."""

    def __init__(self, payload: bytes | None, hold_s: float = 0.2):
        self.payload, self.hold_s = payload, hold_s

    async def _handle(self, reader, writer):
        try:
            if self.payload is None:
                await asyncio.sleep(3600)
            writer.write(self.payload)
            await writer.drain()
            await asyncio.sleep(self.hold_s)
        finally:
            writer.close()


HTTP1_PAGE = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n<html></html>"

SHORT = {"cloud_first_token_timeout_s": 0.5, "cloud_stall_timeout_s": 0.5}  # CascadeConfig timeouts of a case
GRPC_FAULTS = [
    # id, cloud factory, timeouts, degraded_reason, cloud tokens the client saw first
    pytest.param(lambda: FakeCloud("kill", cut_after=3), {}, "cloud_unavailable", 3, id="killed-mid-stream"),
    pytest.param(
        lambda: FakeCloud("abort", abort_code=grpc.StatusCode.UNAVAILABLE), {}, "cloud_unavailable", 0, id="unavailable"
    ),
    pytest.param(None, {}, "cloud_unavailable", 0, id="nothing-listening"),
    pytest.param(lambda: FakeCloud("stall", cut_after=0), SHORT, "cloud_first_token_timeout", 0, id="slow-first-token"),
    pytest.param(lambda: FakeCloud("stall", cut_after=3), SHORT, "cloud_stall_timeout", 3, id="stalls-mid-stream"),
    pytest.param(
        lambda: FakeCloud("slow", gap_s=0.3),
        {"cloud_stall_timeout_s": 2.0, "cloud_deadline_s": 1.0},
        "cloud_deadline",
        3,
        id="past-the-deadline",
    ),
    pytest.param(
        lambda: FakeCloud("abort", abort_code=grpc.StatusCode.RESOURCE_EXHAUSTED),
        {},
        "cloud_overloaded",
        0,
        id="overloaded",
    ),
    pytest.param(lambda: FakeCloud("abort", abort_code=grpc.StatusCode.INTERNAL), {}, "cloud_error", 0, id="internal"),
    pytest.param(lambda: RawTcp(os.urandom(4096)), {}, "cloud_unavailable", 0, id="random-bytes"),
    pytest.param(lambda: RawTcp(HTTP1_PAGE), {}, "cloud_unavailable", 0, id="http1-server"),
    pytest.param(lambda: RawTcp(None), SHORT, "cloud_first_token_timeout", 0, id="black-hole"),
    pytest.param(NotTandem, {}, "cloud_error", 0, id="grpc-but-not-tandem"),
]


@pytest.mark.parametrize("make_cloud, timeouts, reason, num_cloud", GRPC_FAULTS)
async def test_grpc_cloud_fault_degrades_to_a_whole_local_answer(local_engine, make_cloud, timeouts, reason, num_cloud):
    cloud = make_cloud() if make_cloud is not None else None
    port = await cloud.start() if cloud is not None else free_port()
    client = CloudClient(f"127.0.0.1:{port}")
    runner = CascadeRunner(local_engine, client, CascadeConfig(**timeouts))
    timeout_s = max(timeouts.values(), default=15.0)
    try:
        started = time.monotonic()
        tokens, final = await answer(runner)
        elapsed = time.monotonic() - started
    finally:
        await client.close()
        if cloud is not None:
            await cloud.stop()
    assert_degraded_local_answer(tokens, final, reason)
    tiers = [e.tier for e in tokens]
    assert tiers == ["cloud"] * num_cloud + ["local"] * (len(tiers) - num_cloud)  # nothing shown is taken back
    assert [e.text for e in tokens[:num_cloud]] == CLOUD_WORDS[:num_cloud]
    assert final.routing.cost["local"]["completion_tokens"] == len(tiers) - num_cloud
    assert runner.breaker.num_consecutive_failures == 1 and runner.breaker.state.value == "closed"
    assert elapsed < timeout_s + 15, "a failing cloud must not hold the answer much past its deadline"
    if reason in ("cloud_first_token_timeout", "cloud_stall_timeout", "cloud_deadline") and isinstance(
        cloud, FakeCloud
    ):
        assert cloud.num_cancelled == 1, "a timed-out call is cancelled on the server (a real engine frees its blocks)"
    await assert_idle(local_engine)


async def test_health_not_serving_and_refused_calls_degrade(local_engine):
    """A cloud that says NOT_SERVING and refuses Generate (as a loading or draining server does)."""
    cloud = FakeCloud("abort", abort_code=grpc.StatusCode.UNAVAILABLE)
    port = await cloud.start(serving=False)
    client = CloudClient(f"127.0.0.1:{port}")
    runner = CascadeRunner(local_engine, client, CascadeConfig())
    try:
        assert await client.health() == "NOT_SERVING"
        tokens, final = await answer(runner, model="auto:1")  # threshold 1: the router escalates
    finally:
        await client.close()
        await cloud.stop()
    assert_degraded_local_answer(tokens, final, "cloud_unavailable")
    assert final.routing.escalated and {e.tier for e in tokens} == {"local"}
    assert cloud.num_calls == 2  # an UNAVAILABLE before the first token is retried once, no more
    await assert_idle(local_engine)


# -- the OpenAI-compatible client against garbage HTTP ------------------------------------------


def sse(*chunks, done: bool = True) -> bytes:
    body = "".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


def http_response(
    body: bytes, content_type: str = "text/event-stream", status: str = "200 OK", extra: str = ""
) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


def word(text: str, finish: str | None = None) -> dict:
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


TWO_WORDS = [word(" cloud0"), word(" cloud1")]

HTTP_GARBAGE = [
    # id, raw HTTP answer to every request, degraded_reason, cloud words shown before it broke
    pytest.param(sse(*TWO_WORDS, "{not json"), "cloud_error", 2, id="malformed-json-mid-stream"),
    pytest.param(sse({"choices": "abc"}), "cloud_error", 0, id="choices-a-string"),
    pytest.param(sse(*TWO_WORDS, {"choices": [{"delta": "hello"}]}), "cloud_error", 2, id="delta-a-string"),
    pytest.param(sse({"choices": [{"delta": {"content": 5}}]}), "cloud_error", 0, id="content-a-number"),
    pytest.param(
        sse(word(" a", "stop"), {"choices": [], "usage": {"prompt_tokens": "many"}}),
        "cloud_error",
        0,
        id="usage-not-numbers",
    ),
    pytest.param(
        sse({"choices": [{"delta": {"content": "a"}, "logprobs": {"content": ["x"]}}]}),
        "cloud_error",
        0,
        id="logprobs-wrong-shape",
    ),
    pytest.param(sse(word(" a", finish=7)), "cloud_error", 0, id="finish-reason-a-number"),
    pytest.param(sse(*TWO_WORDS, done=False), "cloud_error", 2, id="truncated-sse"),
    pytest.param(sse(*TWO_WORDS, done=False) + b'data: {"choi', "cloud_error", 2, id="truncated-mid-chunk"),
    pytest.param(http_response(b"<html>hi</html>", "text/html"), "cloud_error", 0, id="html-page"),
    pytest.param(
        http_response(b"\x00\x01garbage", extra="Content-Encoding: gzip\r\n"), "cloud_error", 0, id="undecodable-gzip"
    ),
    pytest.param(
        http_response(b"<html>oops</html>", "text/html", "500 Internal Server Error"), "cloud_error", 0, id="500-html"
    ),
    pytest.param(http_response(b"{}", "application/json", "503 Service Unavailable"), "cloud_unavailable", 0, id="503"),
    pytest.param(os.urandom(2048), "cloud_unavailable", 0, id="random-bytes"),
    pytest.param(None, "cloud_first_token_timeout", 0, id="never-answers"),
]


class RawHttp(LoopbackTcpServer):
    """Reads one HTTP/1 request per connection and answers with `payload` verbatim; if
    `payload` is already a full HTTP answer it is sent as is, else as an SSE 200's body."""

    def __init__(self, payload: bytes | None):
        if payload is not None and not payload.startswith(b"HTTP/1.1") and payload.startswith(b"data:"):
            payload = http_response(payload)
        self.payload = payload
        self.num_requests = 0

    async def _handle(self, reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            self.num_requests += 1
            if self.payload is None:
                await asyncio.sleep(3600)
            writer.write(self.payload)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("payload, reason, num_cloud", HTTP_GARBAGE)
async def test_openai_cloud_garbage_degrades_to_a_whole_local_answer(local_engine, payload, reason, num_cloud):
    cloud = RawHttp(payload)
    port = await cloud.start()
    client = OpenAICloudClient(f"http://127.0.0.1:{port}/v1")
    runner = CascadeRunner(local_engine, client, CascadeConfig(cloud_model="m", cloud_first_token_timeout_s=1.0))
    try:
        tokens, final = await answer(runner)
    finally:
        await client.close()
        await cloud.stop()
    assert_degraded_local_answer(tokens, final, reason)
    tiers = [e.tier for e in tokens]
    assert tiers == ["cloud"] * num_cloud + ["local"] * (len(tiers) - num_cloud)
    assert [e.text for e in tokens[:num_cloud]] == CLOUD_WORDS[:num_cloud]
    assert runner.breaker.num_consecutive_failures == 1
    assert cloud.num_requests >= 1
    await assert_idle(local_engine)


async def test_openai_cloud_listing_garbage_models_degrades(local_engine):
    """No cloud_model configured: the client asks /models first, and gets a list of nothing usable."""
    cloud = RawHttp(http_response(json.dumps({"data": "none"}).encode(), "application/json"))
    port = await cloud.start()
    client = OpenAICloudClient(f"http://127.0.0.1:{port}/v1")
    runner = CascadeRunner(local_engine, client, CascadeConfig())
    try:
        tokens, final = await answer(runner)
    finally:
        await client.close()
        await cloud.stop()
    assert_degraded_local_answer(tokens, final, "cloud_unavailable")
    await assert_idle(local_engine)


# -- recovery ----------------------------------------------------------------------------------


COOL_DOWN_S = 1.0


class Clock:
    """The breaker's clock, moved by the test: cool-downs end when the test says, however
    slowly the local answers come on a loaded machine."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def cool_down(self) -> None:
        self.now += COOL_DOWN_S


async def reachable(client: CloudClient, timeout_s: float = 10.0) -> None:
    """Wait until the client's channel reaches the cloud again (calls fail fast while gRPC backs off)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await client.health(timeout_s=1.0) == "SERVING":
                return
        except CloudError:
            pass
        assert time.monotonic() < deadline, f"the cloud was not reachable again within {timeout_s} s"
        await asyncio.sleep(0.1)


async def test_breaker_opens_on_a_dead_grpc_cloud_and_closes_when_it_returns(local_engine):
    port = free_port()
    client = CloudClient(f"127.0.0.1:{port}")
    clock = Clock()
    config = CascadeConfig(breaker_failure_threshold=2, breaker_cool_down_s=COOL_DOWN_S)
    runner = CascadeRunner(local_engine, client, config, clock=clock)
    cloud = FakeCloud("ok")
    try:
        reasons = [(await answer(runner))[1].routing.degraded_reason for _ in range(3)]
        assert reasons == ["cloud_unavailable", "cloud_unavailable", "circuit_open"]
        assert runner.breaker.state.value == "open"
        await cloud.start(port)  # the cloud is back on its address
        _, final = await answer(runner)
        assert final.routing.degraded_reason == "circuit_open" and cloud.num_calls == 0  # still cooling down
        await reachable(client)  # the channel reconnects on its own (backoff capped at 2 s: CHANNEL_OPTIONS)
        clock.cool_down()
        tokens, final = await answer(runner)
        assert (final.routing.tier, final.routing.degraded) == ("cloud", False), final.routing
        assert [e.text for e in tokens] == CLOUD_WORDS and final.finish_reason == "length"
        assert runner.breaker.state.value == "closed" and runner.breaker.num_consecutive_failures == 0
        _, again = await answer(runner, model="auto:1")
        assert (again.routing.tier, again.routing.escalated, again.routing.degraded) == ("cloud", True, False)
        assert cloud.num_calls == 2
    finally:
        await client.close()
        await cloud.stop()
    await assert_idle(local_engine)


async def test_breaker_reopens_when_the_half_open_trial_fails_then_recovers(local_engine):
    """A cloud that is back but still broken (stalling) fails the trial call: open again;
    once it answers, the next trial closes the breaker."""
    cloud = FakeCloud("stall", cut_after=0)
    port = await cloud.start()
    client = CloudClient(f"127.0.0.1:{port}")
    config = CascadeConfig(
        breaker_failure_threshold=1, breaker_cool_down_s=COOL_DOWN_S, cloud_first_token_timeout_s=0.5
    )
    clock = Clock()
    runner = CascadeRunner(local_engine, client, config, clock=clock)
    try:
        assert (await answer(runner))[1].routing.degraded_reason == "cloud_first_token_timeout"
        assert runner.breaker.state.value == "open"
        clock.cool_down()
        assert (await answer(runner))[1].routing.degraded_reason == "cloud_first_token_timeout"  # the trial failed
        assert runner.breaker.state.value == "open" and cloud.num_calls == 2
        cloud.mode = "ok"
        assert (await answer(runner))[1].routing.degraded_reason == "circuit_open"
        clock.cool_down()
        _, final = await answer(runner)
        assert (final.routing.tier, final.routing.degraded) == ("cloud", False)
        assert runner.breaker.state.value == "closed"
    finally:
        await client.close()
        await cloud.stop()
    await assert_idle(local_engine)


async def test_openai_cloud_recovers_after_garbage(local_engine):
    bad = sse({"choices": "abc"})
    cloud = RawHttp(bad)
    port = await cloud.start()
    client = OpenAICloudClient(f"http://127.0.0.1:{port}/v1")
    config = CascadeConfig(cloud_model="m", breaker_failure_threshold=2, breaker_cool_down_s=COOL_DOWN_S)
    clock = Clock()
    runner = CascadeRunner(local_engine, client, config, clock=clock)
    try:
        reasons = [(await answer(runner))[1].routing.degraded_reason for _ in range(3)]
        assert reasons == ["cloud_error", "cloud_error", "circuit_open"] and cloud.num_requests == 2
        cloud.payload = http_response(sse(*[word(w) for w in CLOUD_WORDS[:-1]], word(CLOUD_WORDS[-1], "length")))
        await reachable(client)  # the channel reconnects on its own (backoff capped at 2 s: CHANNEL_OPTIONS)
        clock.cool_down()
        tokens, final = await answer(runner)
        assert (final.routing.tier, final.routing.degraded) == ("cloud", False), final.routing
        assert "".join(e.text for e in tokens) == "".join(CLOUD_WORDS)
        assert runner.breaker.state.value == "closed"
    finally:
        await client.close()
        await cloud.stop()
    await assert_idle(local_engine)


class ClientThatBreaks(CloudBackend):
    """A cloud client that lets a non-CloudError escape after `num_tokens`."""

    def __init__(self, error: Exception, num_tokens: int = 2):
        self.error, self.num_tokens = error, num_tokens

    async def generate(self, *args, **kwargs):
        for i in range(self.num_tokens):
            yield CloudTokenEvent("r", i, CLOUD_WORDS[i], -0.1, 0.5, 0.2, num_output_tokens=i + 1)
        raise self.error


@pytest.mark.parametrize(
    "error, reason",
    [
        (ValueError("a chunk the client could not read"), "cloud_error"),
        (ConnectionResetError("reset by peer"), "cloud_unavailable"),
        (TimeoutError(), "cloud_deadline"),
    ],
)
async def test_any_exception_from_the_cloud_client_degrades_instead_of_escaping(local_engine, error, reason):
    runner = CascadeRunner(local_engine, ClientThatBreaks(error), CascadeConfig())
    tokens, final = await answer(runner)
    assert_degraded_local_answer(tokens, final, reason)
    assert [e.tier for e in tokens[:2]] == ["cloud", "cloud"] and tokens[-1].tier == "local"
    assert runner.breaker.num_consecutive_failures == 1
    await assert_idle(local_engine)
