"""Fuzzing the tandem.v1 gRPC service (Generate, GenerateWithDrafts) with generated wire bytes, over real
loopback gRPC.

Requests are encoded by hand (a small protobuf wire writer below), so they can hold what the
generated classes refuse to build: negative or 64-bit values in uint32 fields, NaN/inf floats,
invalid UTF-8 in string fields, unknown fields, wrong wire types, truncated messages, and a
message over the server's configured max_message_bytes. Each goes through a generic channel
call with raw bytes. Every call must end promptly with OK (a stream whose last response has a
finish reason) or a non-OK code with a non-empty message: INVALID_ARGUMENT / NOT_FOUND for
requests that parse, INVALID_ARGUMENT also for bytes that do not parse,
RESOURCE_EXHAUSTED for oversized messages; never UNKNOWN, never the servicer's own INTERNAL.
Afterwards the server still serves and the engine holds no request and no KV block.

GenerateWithDrafts streams open a valid request and then send generated draft messages: tokens past the
vocabulary and past max_draft_tokens, supports wider than draft_max_support, NaN and negative
probabilities, messages too big to be a draft, an `open` where a draft belongs, bytes that do not parse.
A stream whose drafts are all within the bounds answers whole (OK); otherwise the first draft past a bound
ends it with INVALID_ARGUMENT naming that bound, and a flood of drafts with RESOURCE_EXHAUSTED naming the
setting it passed (sdk.serving.grpc.draft_door).
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import threading
import time

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk.protocol.drafts import MAX_DRAFT_TOKENS, MAX_SUPPORT_TOKENS, DraftLimits, OutsideDraft
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.serving.grpc.server import GrpcServerConfig, bound_port, start_grpc_server, stop_grpc_server
from tests.cloud_engine.grpc_helpers import long_tiny_dir, make_engine  # noqa: F401  (fixture)
from tests.reliability.fuzz_strategies import HUGE_INTS, REQUEST_TIMEOUT_S, RequestCounter, fuzz_settings, odd_text

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 128
MAX_MESSAGE_BYTES = 64 * 1024
VOCAB = 300
N_GENERATE = 1500
N_DRAFTED = 150
GENERATE = "/tandem.v1.Tandem/Generate"
DRAFTED = "/tandem.v1.Tandem/GenerateWithDrafts"
MAX_DRAFT_BYTES = DraftLimits().max_message_bytes(MAX_DRAFT_TOKENS)

COUNTER = RequestCounter()


# -- the protobuf wire format ------------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negatives as protobuf writes them: ten bytes of two's complement
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def f_varint(number: int, value: int) -> bytes:
    return tag(number, 0) + varint(value)


def f_bytes(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


def f_float(number: int, value: float) -> bytes:
    return tag(number, 5) + struct.pack("<f", value)


def f_packed(number: int, values: list[int]) -> bytes:
    return f_bytes(number, b"".join(varint(v) for v in values))


# -- strategies ----------------------------------------------------------------------------------------

text_bytes = st.one_of(
    odd_text.map(lambda s: s.encode("utf-8", "surrogatepass")),  # lone surrogates: invalid UTF-8
    st.sampled_from([b"w5 w6 w7", b"w5", b"", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"w5 " * 20_000]),
    st.binary(max_size=30),
)
small_uint = st.one_of(st.integers(0, 4), st.integers(0, VOCAB + 5))
extreme_int = st.one_of(st.sampled_from(HUGE_INTS), st.integers(-(2**64), 2**64))
float_values = st.one_of(
    st.floats(width=32), st.sampled_from([0.0, -0.0, 1e-45, 1e-38, -1.0, 2.5, math.nan, math.inf, -math.inf])
)


def pick(draw, p_extreme: int, normal, extreme):
    return draw(extreme if draw(st.integers(0, 99)) < p_extreme else normal)


@st.composite
def sampling_bytes(draw) -> bytes:
    out = b""
    if draw(st.integers(0, 9)):  # max_tokens: set, mostly small; unset means "the rest of the context"
        out += f_varint(
            1,
            pick(
                draw,
                15,
                st.integers(1, 4),
                st.one_of(extreme_int, st.sampled_from([0, MAX_MODEL_LEN, 2**32 - 1, 2**32 + 2])),
            ),
        )
    if draw(st.booleans()):
        out += f_float(2, pick(draw, 40, st.floats(0, 2, width=32), float_values))
    if draw(st.integers(0, 3)) == 0:
        out += f_float(3, pick(draw, 40, st.floats(0.125, 1, width=32), float_values))
    if draw(st.integers(0, 3)) == 0:
        out += f_varint(4, pick(draw, 30, st.integers(0, 400), extreme_int))
    if draw(st.integers(0, 3)) == 0:
        out += f_varint(5, draw(extreme_int))
    for stop in draw(st.lists(text_bytes, max_size=draw(st.sampled_from([2, 2, 20])))):
        out += f_bytes(6, stop)
    if draw(st.integers(0, 4)) == 0:
        out += f_packed(7, draw(st.lists(st.one_of(small_uint, extreme_int), max_size=4)))
    if draw(st.integers(0, 4)) == 0:
        out += f_varint(8, draw(st.sampled_from([0, 1, 2, 2**64 - 1])))
    if draw(st.integers(0, 4)) == 0:
        out += f_varint(9, pick(draw, 40, st.integers(0, 20), st.one_of(st.integers(21, 1000), extreme_int)))
    return out


@st.composite
def message_bytes(draw) -> bytes:
    role = draw(st.one_of(st.sampled_from([b"user", b"system", b"assistant", b"bogus", b""]), text_bytes))
    return f_bytes(1, role) + f_bytes(2, draw(text_bytes))


@st.composite
def prompt_bytes(draw) -> bytes:
    kind = draw(st.sampled_from(["text", "text", "ids", "ids", "messages", "none", "two"]))
    if kind == "text":
        return f_bytes(5, draw(text_bytes))
    if kind == "ids":
        ids = draw(st.lists(st.one_of(small_uint, small_uint, extreme_int), max_size=8))
        return f_bytes(4, f_packed(1, ids))
    if kind == "messages":
        return f_bytes(3, b"".join(f_bytes(1, m) for m in draw(st.lists(message_bytes(), max_size=3))))
    if kind == "two":  # a oneof set twice: the last one wins
        return f_bytes(5, b"w5") + f_bytes(4, f_packed(1, [5, 6]))
    return b""


@st.composite
def generate_requests(draw) -> bytes:
    parts = [prompt_bytes()]
    if draw(st.integers(0, 4)) == 0:
        parts.append(st.builds(lambda b: f_bytes(1, b), text_bytes))  # request_id
    if draw(st.integers(0, 4)) == 0:
        parts.append(st.builds(lambda b: f_bytes(2, b), st.one_of(st.just(b"tiny"), text_bytes)))  # model
    if draw(st.integers(0, 9)):
        parts.append(sampling_bytes().map(lambda b: f_bytes(6, b)))
    if draw(st.integers(0, 5)) == 0:
        parts.append(st.lists(st.one_of(small_uint, extreme_int), max_size=5).map(lambda ids: f_packed(7, ids)))
    if draw(st.integers(0, 5)) == 0:
        parts.append(extreme_int.map(lambda v: f_varint(8, v)))  # priority (int32)
    if draw(st.integers(0, 9)) == 0:  # an unknown field of each wire type
        parts.append(st.sampled_from([f_varint(99, 7), f_bytes(100, b"x"), f_float(101, 1.0), tag(102, 1) + b"\0" * 8]))
    body = b"".join(draw(p) for p in draw(st.permutations(parts)))
    mutation = draw(st.integers(0, 19))
    if mutation == 0 and body:
        return body[: draw(st.integers(0, len(body) - 1))]  # truncated
    if mutation == 1:
        return body + draw(st.binary(min_size=1, max_size=10))  # trailing garbage
    if mutation == 2 and body:
        at = draw(st.integers(0, len(body) - 1))
        return body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1 :]  # a flipped byte
    if mutation == 3:
        return draw(
            st.sampled_from(
                [tag(5, 2) + varint(2**40), tag(6, 3), tag(0, 0) + b"\0", b"\xff" * 11, tag(3, 0) + b"\x01"]
            )
        )
    return body


probability = st.one_of(st.floats(0, 1, width=32), float_values)


@st.composite
def support_bytes(draw, token: int) -> bytes:
    """One DraftSupport: usually a small distribution holding `token`, sometimes past a bound."""
    width = draw(st.sampled_from([1, 1, 2, 5, MAX_SUPPORT_TOKENS, MAX_SUPPORT_TOKENS + 1]))
    ids = [token, *(draw(small_uint) for _ in range(width - 1))] if width <= 5 else list(range(3, 3 + width))
    if draw(st.integers(0, 3)):
        probs = [1.0 / len(ids)] * len(ids)
    else:
        probs = draw(st.lists(probability, min_size=len(ids), max_size=len(ids) + 1))
    return f_packed(1, ids) + f_bytes(2, b"".join(struct.pack("<f", p) for p in probs))


@st.composite
def draft_bytes(draw) -> bytes:
    """One later message of a GenerateWithDrafts stream: mostly a Draft, within the bounds or past one."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return f_bytes(1, f_bytes(5, b"w5"))  # an `open` where a draft belongs
    if kind == 1:
        return draw(st.binary(min_size=1, max_size=12))  # bytes, most of which do not parse
    if kind == 2:
        return f_bytes(2, f_packed(2, [5] * (MAX_DRAFT_BYTES // 2)))  # too big to be a draft
    num_tokens = draw(st.sampled_from([0, 1, 2, 4, MAX_DRAFT_TOKENS, MAX_DRAFT_TOKENS + 1, 40]))
    tokens = [pick(draw, 5, small_uint, extreme_int) for _ in range(min(num_tokens, MAX_DRAFT_TOKENS + 1))]
    tokens += tokens[-1:] * (num_tokens - len(tokens))
    body = f_varint(1, pick(draw, 10, st.integers(0, 3), extreme_int)) + f_packed(2, tokens)
    if tokens and draw(st.booleans()):  # sampled: a support per token (or one too few or too many)
        num_supports = max(0, len(tokens) + draw(st.sampled_from([0, 0, 0, -1, 1])))
        for index in range(num_supports):
            body += f_bytes(3, draw(support_bytes(tokens[min(index, len(tokens) - 1)])))
    return f_bytes(2, body)


def draft_refusal(raw: bytes) -> str | None:
    """What the door must name refusing `raw` (a part of its message), or None for a draft it takes."""
    if len(raw) > MAX_DRAFT_BYTES:
        return "bytes"
    try:
        message = pb.DraftedGenerateRequest.FromString(raw)
    except Exception:
        return "not a valid tandem.v1.DraftedGenerateRequest"
    if message.WhichOneof("kind") != "draft":
        return "later ones are drafts"
    draft = message.draft
    if len(draft.token_ids) > MAX_DRAFT_TOKENS:
        return "cloud.max_draft_tokens"
    if any(max(len(s.token_ids), len(s.probs)) > MAX_SUPPORT_TOKENS for s in draft.support):
        return "cloud_server.draft_max_support"
    support = tuple((tuple(s.token_ids), tuple(s.probs)) for s in draft.support) or None
    try:
        OutsideDraft("r", draft.start, tuple(draft.token_ids), support).check(VOCAB)
    except ValueError:
        return "GenerateWithDrafts: draft: "
    return None


DRAFTED_OPEN = f_bytes(1, f_bytes(5, b"w5 w6") + f_bytes(6, f_varint(1, 60) + f_float(2, 0.0) + f_varint(8, 1)))


# -- the server ----------------------------------------------------------------------------------------


class ServerThread:
    """A gRPC server on its own event loop thread, so the (synchronous) hypothesis tests can call it."""

    def __init__(self, engine, **config):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-grpc", daemon=True)
        self.thread.start()
        self.server = self.run(start_grpc_server(engine, GrpcServerConfig(port=0, **config)))
        self.address = f"127.0.0.1:{bound_port(self.server)}"

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def stop(self) -> None:
        self.run(stop_grpc_server(self.server, grace_s=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture(scope="module")
def fuzz_engine(long_tiny_dir):  # noqa: F811
    engine = make_engine(long_tiny_dir, max_model_len=MAX_MODEL_LEN)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(fuzz_engine):
    server = ServerThread(fuzz_engine, max_message_bytes=MAX_MESSAGE_BYTES)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def channel(server):
    # The client may send more than the server accepts: the server's limit is under test.
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        yield channel


@pytest.fixture(autouse=True)
def no_servicer_errors(caplog):
    """The servicer logs an ERROR for every unexpected exception (and answers INTERNAL): none allowed."""
    caplog.set_level(logging.ERROR)
    yield
    errors = [r for r in caplog.records if r.name.startswith(("cloud_engine", "grpc")) and r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


# -- checks --------------------------------------------------------------------------------------------


def call(channel, payload: bytes) -> tuple[grpc.StatusCode, str, list[pb.GenerateResponse]]:
    """One Generate call with raw request bytes: (code, details, responses); a hang fails the test."""
    COUNTER.add("grpc")
    stub = channel.unary_stream(GENERATE, request_serializer=None, response_deserializer=pb.GenerateResponse.FromString)
    responses = []
    start = time.monotonic()
    try:
        for response in stub(payload, timeout=REQUEST_TIMEOUT_S):
            responses.append(response)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"hang: no end after {time.monotonic() - start:.1f}s"
    return code, details, responses


def parses(payload: bytes) -> bool:
    try:
        pb.GenerateRequest.FromString(payload)
        return True
    except Exception:
        return False


def check_call(channel, payload: bytes) -> grpc.StatusCode:
    code, details, responses = call(channel, payload)
    if code == grpc.StatusCode.OK:
        assert responses, "OK with no response"
        assert responses[-1].finish_reason in ("stop", "length"), responses[-1]
        assert all(not r.finish_reason for r in responses[:-1])
        return code
    assert details.strip(), f"{code} without a message"
    if len(payload) > MAX_MESSAGE_BYTES:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    elif not parses(payload):
        # Bytes that are not a GenerateRequest: refused by the servicer's own parsing (gRPC's
        # deserializer would answer UNKNOWN and log a traceback per request).
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a valid tandem.v1.GenerateRequest" in details, (
            code,
            details,
        )
    else:
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (
            code,
            details,
            pb.GenerateRequest.FromString(payload),
        )
    return code


def wait_idle(engine, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.stats()
        if (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0):
            return
        assert time.monotonic() < deadline, f"engine not idle after the fuzz run: {stats}"
        time.sleep(0.05)


def assert_still_serving(channel) -> None:
    normal = pb.GenerateRequest(text="w5 w6", sampling=pb.SamplingParams(max_tokens=3, temperature=0.0))
    code, _, responses = call(channel, normal.SerializeToString())
    assert (
        code == grpc.StatusCode.OK
        and responses[-1].finish_reason == "length"
        and responses[-1].usage.completion_tokens == 3
    )


# -- tests ---------------------------------------------------------------------------------------------


def test_fuzz_generate(channel, fuzz_engine):
    seen: dict[grpc.StatusCode, int] = {}

    @fuzz_settings(N_GENERATE)
    @given(payload=generate_requests())
    def run(payload):
        code = check_call(channel, payload)
        seen[code] = seen.get(code, 0) + 1

    run()
    print(
        f"\nfuzzed gRPC Generate calls: {COUNTER.counts['grpc']}; "
        f"status codes: { {c.name: n for c, n in seen.items()} }"
    )
    assert seen.get(grpc.StatusCode.OK, 0) >= 20 and seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > N_GENERATE // 20
    assert COUNTER.counts["grpc"] >= N_GENERATE
    wait_idle(fuzz_engine)
    assert_still_serving(channel)
    wait_idle(fuzz_engine)


@pytest.mark.parametrize(
    "payload, expected",
    [
        (
            pb.GenerateRequest(text="w5" * (MAX_MESSAGE_BYTES // 2 + 1)).SerializeToString(),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (f_bytes(5, b"w5 " * 1_000_000), grpc.StatusCode.RESOURCE_EXHAUSTED),  # 3 MB, under gRPC's default limit
        # Regression: bytes that do not parse were UNKNOWN (gRPC's deserializer), with a logged traceback each.
        (f_bytes(5, b"w5 \xff"), grpc.StatusCode.INVALID_ARGUMENT),  # invalid UTF-8 in a string field
        (
            f_bytes(3, f_bytes(1, f_bytes(1, b"user") + f_bytes(2, b"\xed\xa0\x80"))),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),  # a lone surrogate
        (b"", grpc.StatusCode.INVALID_ARGUMENT),  # every field at its default: no prompt
        (f_bytes(5, b""), grpc.StatusCode.INVALID_ARGUMENT),  # empty text
        (f_bytes(3, b""), grpc.StatusCode.INVALID_ARGUMENT),  # empty messages
        (f_bytes(4, b""), grpc.StatusCode.INVALID_ARGUMENT),  # empty token ids
        (f_bytes(5, b"w5") + f_bytes(6, f_varint(1, 2**32 - 1)), grpc.StatusCode.INVALID_ARGUMENT),  # huge max_tokens
        (f_bytes(5, b"w5") + f_bytes(6, f_varint(1, -1)), grpc.StatusCode.INVALID_ARGUMENT),  # -1 read as a uint32
        (f_bytes(4, f_packed(1, [2**32 - 1])), grpc.StatusCode.INVALID_ARGUMENT),  # a token id beyond the vocabulary
        (f_bytes(5, b"w5") + f_bytes(6, f_float(2, math.nan)), grpc.StatusCode.INVALID_ARGUMENT),
        (f_bytes(5, b"w5") + f_bytes(6, f_float(3, math.inf)), grpc.StatusCode.INVALID_ARGUMENT),
        (
            f_bytes(5, b"w5") + f_bytes(6, f_varint(1, 2) + f_float(2, 1e-45)),
            grpc.StatusCode.OK,
        ),  # tiny temperature: greedy
        (
            f_bytes(5, b"w5") + f_bytes(6, f_varint(1, 2) + f_varint(5, 2**64 - 1)),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),  # seed
        (f_bytes(5, b"w5") + f_bytes(2, b"other"), grpc.StatusCode.NOT_FOUND),
        # Regression: the status echoed a 60 kB model name, over the client's metadata limit (RESOURCE_EXHAUSTED).
        (f_bytes(5, b"w5") + f_bytes(2, "é".encode() * 30_000), grpc.StatusCode.NOT_FOUND),
        (
            f_bytes(5, b"w5") + f_bytes(6, f_varint(1, 2)) + f_varint(8, -(2**31)),
            grpc.StatusCode.OK,
        ),  # priority int32 min
        (b"\xff" * 11, grpc.StatusCode.INVALID_ARGUMENT),  # not a protobuf message
    ],
)
def test_malformed_and_extreme_messages(channel, fuzz_engine, payload, expected):
    code = check_call(channel, payload)
    if expected is not None:
        assert code == expected
    else:
        assert code != grpc.StatusCode.OK
    wait_idle(fuzz_engine)
    assert_still_serving(channel)


def test_tiny_temperature_is_greedy_over_grpc(channel, fuzz_engine):
    """Regression (found by the HTTP fuzzer, same sampler): a subnormal temperature overflowed the
    logits to inf and the call failed with INTERNAL; it now samples greedily."""

    def tokens(temperature: float) -> list[int]:
        request = pb.GenerateRequest(
            text="w5 w6", sampling=pb.SamplingParams(max_tokens=4, temperature=temperature, ignore_eos=True)
        )
        code, details, responses = call(channel, request.SerializeToString())
        assert code == grpc.StatusCode.OK, (code, details)
        return [r.token_id for r in responses]

    assert tokens(1e-45) == tokens(1e-30) == tokens(0.0)
    wait_idle(fuzz_engine)


# -- GenerateWithDrafts ---------------------------------------------------------------------------------


def drafted_call(channel, messages: list[bytes]) -> tuple[grpc.StatusCode, str, list[pb.GenerateResponse]]:
    """One GenerateWithDrafts call with raw messages, all written at once: (code, details, responses)."""
    COUNTER.add("grpc-drafts")
    stub = channel.stream_stream(DRAFTED, request_serializer=None, response_deserializer=pb.GenerateResponse.FromString)
    responses = []
    try:
        for response in stub(iter(messages), timeout=REQUEST_TIMEOUT_S):
            responses.append(response)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "hang: a drafted call did not end"
    return code, details, responses


def check_drafted_call(channel, drafts: list[bytes]) -> grpc.StatusCode:
    """A stream of drafts all within the bounds answers whole; otherwise the first one past a bound ends it with
    INVALID_ARGUMENT naming that bound (the answer's 60 tokens outlast the door's reading of every draft)."""
    code, details, responses = drafted_call(channel, [DRAFTED_OPEN, *drafts])
    expected = next((refusal for refusal in map(draft_refusal, drafts) if refusal is not None), None)
    if expected is None:
        assert code == grpc.StatusCode.OK and responses[-1].finish_reason == "length", (code, details)
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT and expected in details, (code, details, expected)
    return code


def test_fuzz_generate_with_drafts(channel, fuzz_engine):
    seen: dict[grpc.StatusCode, int] = {}

    @fuzz_settings(N_DRAFTED)
    @given(drafts=st.lists(draft_bytes(), min_size=1, max_size=4))
    def run(drafts):
        code = check_drafted_call(channel, drafts)
        seen[code] = seen.get(code, 0) + 1

    run()
    print(f"\nfuzzed gRPC GenerateWithDrafts calls: {COUNTER.counts['grpc-drafts']}; status codes: {seen}")
    assert seen.get(grpc.StatusCode.OK, 0) >= 10 and seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0) >= N_DRAFTED // 4
    wait_idle(fuzz_engine)
    assert_still_serving(channel)


@pytest.mark.parametrize(
    ("drafts", "code", "named"),
    [
        ([f_bytes(2, f_packed(2, [5] * (MAX_DRAFT_TOKENS + 1)))], grpc.StatusCode.INVALID_ARGUMENT, "max_draft_tokens"),
        (
            [f_bytes(2, f_packed(2, [5]) + f_bytes(3, f_packed(1, range(3, 3 + MAX_SUPPORT_TOKENS + 1))))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "draft_max_support",
        ),
        ([f_bytes(2, f_packed(2, [VOCAB + 1]))], grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
        # Under gRPC's own limit (MAX_MESSAGE_BYTES) but past a draft's: refused before it is parsed.
        ([f_bytes(2, f_packed(2, [5] * (MAX_MESSAGE_BYTES // 2)))], grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
        # A flood: past the drafts a second, or the drafts the engine has not taken yet, whichever comes first.
        ([f_bytes(2, f_packed(2, [5, 6]))] * 400, grpc.StatusCode.RESOURCE_EXHAUSTED, "cloud_server.drafts_"),
    ],
    ids=["too-long", "too-wide", "outside-vocabulary", "too-big", "flood"],
)
def test_drafts_past_the_bounds(channel, fuzz_engine, drafts, code, named):
    got, details, _ = drafted_call(channel, [DRAFTED_OPEN, *drafts])
    assert got == code and named in details, (got, details)
    wait_idle(fuzz_engine)
    assert_still_serving(channel)
