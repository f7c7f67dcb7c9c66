"""GenerateWithDrafts' door (issue 66), over real gRPC on loopback with raw messages: a draft past a bound
is refused where it arrives, naming the setting that sets the bound (INVALID_ARGUMENT for a draft too long,
too wide, too big on the wire or outside the vocabulary; RESOURCE_EXHAUSTED for drafts too fast or piling up
before the engine takes them), the request is aborted at once, and the engine holds nothing afterwards.
On e22a9a3 every one of these calls ended OK: the server took any draft and dropped the bad ones quietly."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from sdk.protocol.drafts import MAX_DRAFT_TOKENS, MAX_SUPPORT_TOKENS, DraftLimits
from sdk.protocol.wire import tandem_pb2 as pb
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, serve, wait_drained  # noqa: F401  (fixtures)
from tests.cloud_engine.tiny_models import VOCAB_SIZE, random_tokens

METHOD = "/tandem.v1.Tandem/GenerateWithDrafts"
PROMPT = random_tokens(8, seed=11)
# Long enough that the call is still streaming when the drafts arrive (the tiny model: ~1 s).
OPEN = pb.DraftedGenerateRequest(
    open=pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True),
    )
).SerializeToString()


def draft(token_ids, support=None, start: int = 1) -> bytes:
    message = pb.Draft(start=start, token_ids=list(token_ids))
    for ids, probs in support or ():
        message.support.add(token_ids=list(ids), probs=list(probs))
    return pb.DraftedGenerateRequest(draft=message).SerializeToString()


async def drafted_call(target: str, drafts: list[bytes]) -> tuple[grpc.StatusCode, str, int]:
    """Open a request, wait for its first token, write `drafts`, and read to the end: (status code, details,
    responses read). Through grpc's synchronous client (on a thread): its asyncio one reports a call the server
    ended while a write was in flight as INTERNAL ("Internal error from Core") in place of the server's status."""
    return await asyncio.to_thread(_drafted_call, target, drafts)


def _drafted_call(target: str, drafts: list[bytes]) -> tuple[grpc.StatusCode, str, int]:
    first_token = threading.Event()

    def requests():
        yield OPEN
        first_token.wait(30)
        yield from drafts

    options = [("grpc.max_send_message_length", -1)]  # the server's bounds are under test, not the client's
    with grpc.insecure_channel(target, options=options) as channel:
        call = channel.stream_stream(
            METHOD, request_serializer=None, response_deserializer=pb.GenerateResponse.FromString
        )
        responses = 0
        try:
            for _ in call(requests(), timeout=60):
                responses += 1
                first_token.set()
            return grpc.StatusCode.OK, "", responses
        except grpc.RpcError as error:
            return error.code(), error.details() or "", responses
        finally:
            first_token.set()


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (draft(range(3, 3 + MAX_DRAFT_TOKENS + 1)), "cloud.max_draft_tokens"),  # one token too many
        (
            draft(
                [5],
                [(range(5, 5 + MAX_SUPPORT_TOKENS + 1), [1.0 / (MAX_SUPPORT_TOKENS + 1)] * (MAX_SUPPORT_TOKENS + 1))],
            ),
            "cloud_server.draft_max_support",
        ),  # one support entry too many
        (draft([5] * 100_000), "bytes"),  # 100 kB on the wire: refused before it is parsed
        (draft([VOCAB_SIZE + 7]), "outside the vocabulary"),  # was dropped at debug level on the engine thread
        (draft([5], [([5, VOCAB_SIZE], [0.5, 0.5])]), "outside the vocabulary"),
        (pb.DraftedGenerateRequest(open=pb.GenerateRequest(text="w5")).SerializeToString(), "later ones are drafts"),
        (b"\xff" * 11, "not a valid"),
    ],
    ids=["too-long", "too-wide", "too-big", "token-outside-vocabulary", "support-outside-vocabulary", "open", "bytes"],
)
async def test_a_draft_past_a_bound_is_invalid_argument_naming_it(engine, serve, raw, named):  # noqa: F811
    code, details, responses = await drafted_call(await serve(engine), [raw])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and named in details, (code, details)
    assert responses < 900  # refused mid-answer: the request was stopped, not answered to its end
    assert await wait_drained(engine)


async def test_drafts_within_the_bounds_are_taken(engine, serve):  # noqa: F811
    """The longest and widest draft the defaults take: the call answers whole."""
    support = [(range(3, 3 + MAX_SUPPORT_TOKENS), [1.0 / MAX_SUPPORT_TOKENS] * MAX_SUPPORT_TOKENS)] * MAX_DRAFT_TOKENS
    widest = draft([3] * MAX_DRAFT_TOKENS, support)
    assert len(widest) <= DraftLimits().max_message_bytes(MAX_DRAFT_TOKENS)
    code, details, responses = await drafted_call(await serve(engine), [widest, draft(PROMPT[:4])])
    assert code == grpc.StatusCode.OK and responses == 900, (code, details)
    assert await wait_drained(engine)


async def test_a_flood_of_drafts_is_resource_exhausted_at_the_defaults(engine, serve):  # noqa: F811
    """Thousands of drafts as fast as the client writes them: the server's default bounds end the call, naming
    the one reached first (drafts a second, or drafts waiting for the engine)."""
    code, details, _ = await drafted_call(await serve(engine), [draft([5, 6])] * 3000)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert "cloud_server.drafts_per_second" in details or "cloud_server.drafts_max_outstanding" in details, details
    assert await wait_drained(engine)


async def test_drafts_faster_than_the_rate_are_resource_exhausted(engine, serve):  # noqa: F811
    target = await serve(engine, draft_limits=DraftLimits(per_second=5, max_outstanding=10**6))
    code, details, _ = await drafted_call(target, [draft([5, 6])] * 50)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "more than 5 drafts a second" in details, details
    assert "cloud_server.drafts_per_second" in details
    assert await wait_drained(engine)


async def test_drafts_the_engine_has_not_taken_are_bounded(engine, serve):  # noqa: F811
    """The engine takes a request's drafts between its steps, keeping only the latest; drafts written faster
    than it steps pile up in the count until the bound ends the call."""
    target = await serve(engine, draft_limits=DraftLimits(per_second=1e6, max_outstanding=3))
    code, details, _ = await drafted_call(target, [draft([5, 6])] * 3000)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "cloud_server.drafts_max_outstanding" in details, details
    assert await wait_drained(engine)
