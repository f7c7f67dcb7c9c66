"""tandem.v1's GenerateWithDrafts over real gRPC on loopback (issue 56's protocol): the caller offers
drafts while the cloud's tokens stream, and the answer is the cloud's own whatever the drafts say;
the responses count what the drafts gave; a malformed draft or a stream that does not open with the
request is INVALID_ARGUMENT; a caller that cancels or stops drafting leaves nothing held."""

from __future__ import annotations

import grpc
import pytest

from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.cloud_backend import CloudError, CloudInvalidArgumentError
from sdk.protocol.drafts import MAX_DRAFT_TOKENS, DraftLimits
from sdk.protocol.engine import SamplingParams
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.wire import tandem_pb2_grpc as pb_grpc
from tests.cloud_engine.grpc_helpers import make_engine, serve, wait_drained  # noqa: F401  (fixture)
from tests.cloud_engine.test_spec_decode_greedy import build_varied_model
from tests.cloud_engine.tiny_models import VOCAB_SIZE, random_tokens

N, K = 24, 4
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = make_engine(build_varied_model(tmp_path_factory.mktemp("drafts-target"), seed=0), max_model_len=64)
    yield engine
    engine.shutdown()


async def answer(call, drafter=None) -> tuple[list[int], object]:
    tokens, last = [], None
    async for event in call:
        tokens.append(event.token_id)
        last = event
        if drafter is not None and len(tokens) < N - 1:
            draft = drafter(tokens)
            if draft:
                call.offer(len(tokens), draft)
    return tokens, last


async def test_the_answer_is_the_clouds_own_and_counts_what_drafts_gave(engine, serve):  # noqa: F811
    """How many drafts land before the cloud has gone past them depends on the machine's timing, so the
    right draft is the longest the server takes (MAX_DRAFT_TOKENS), offered once at the answer's first token
    (48 steps of room); the wrong drafts may land late and be dropped: only the answer is checked for them."""
    long = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    async with CloudClient(await serve(engine)) as client:
        prompt = random_tokens(10, seed=7)
        reference = [event.token_id async for event in client.generate(prompt, long)]
        call = client.generate_with_drafts(prompt, long)
        right, last = [], None
        async for event in call:
            right.append(event.token_id)
            last = event
            if len(right) == 1:
                call.offer(1, reference[1 : 1 + MAX_DRAFT_TOKENS])
        assert right == reference and last.num_accepted_tokens > 0
        assert last.num_accepted_tokens == last.num_draft_tokens  # every verified draft token was right
        wrong, last = await answer(
            client.generate_with_drafts(prompt, GREEDY),
            lambda out: [(t + 1) % VOCAB_SIZE for t in reference[len(out) : len(out) + K]],
        )
        assert wrong == reference[:N] and last.num_accepted_tokens == 0
        quiet, _ = await answer(client.generate_with_drafts(prompt, GREEDY))  # no drafts: it decodes on its own
        assert quiet == reference[:N]
    assert await wait_drained(engine)


async def test_bad_streams_are_invalid_argument_and_hold_nothing(engine, serve):  # noqa: F811
    target = await serve(engine)
    async with CloudClient(target) as client:
        call = client.generate_with_drafts(random_tokens(8, seed=1), SamplingParams(max_tokens=40, temperature=0.0))
        with pytest.raises(CloudError) as refused:
            async for event in call:
                call.offer(1, [5], support=[([5, 6], [0.9, 0.9])])  # its probabilities sum past 1
        assert isinstance(refused.value, CloudInvalidArgumentError) and "sum to" in str(refused.value)
    async with grpc.aio.insecure_channel(target) as channel:
        stream = pb_grpc.TandemStub(channel).GenerateWithDrafts(
            iter([pb.DraftedGenerateRequest(draft=pb.Draft(start=0, token_ids=[1]))])
        )
        with pytest.raises(grpc.aio.AioRpcError) as first:
            async for _ in stream:
                pass
        assert first.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "open" in first.value.details()
    assert await wait_drained(engine)


async def test_a_caller_that_leaves_mid_answer_frees_the_request(engine, serve):  # noqa: F811
    async with CloudClient(await serve(engine)) as client:
        call = client.generate_with_drafts(random_tokens(8, seed=2), SamplingParams(max_tokens=50, temperature=0.0))
        async for event in call:
            call.offer(1, [3, 4])
            break  # the caller goes away after the first token
        call.cancel()
        stopped = client.generate_with_drafts(random_tokens(8, seed=3), GREEDY)
        stopped.close_drafts()  # drafts stop at once: the cloud answers alone
        tokens = [event.token_id async for event in stopped]
        assert len(tokens) == N
    assert await wait_drained(engine)


async def test_drafts_written_as_the_answer_ends_never_fail_it(engine, serve):  # noqa: F811
    """A caller still writing drafts when the answer ends: grpc used to report the call as INTERNAL ("Internal
    error from Core", seen through bench.spec_cascade's delay proxy) in place of its OK. The caller closes its
    side at the last token and the server waits for that, so every answer here ends whole and without error."""
    import asyncio

    short = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    unbounded = DraftLimits(per_second=1e6, max_outstanding=10**6)  # a draft a millisecond is this test's point
    async with CloudClient(await serve(engine, draft_limits=unbounded)) as client:
        prompt = random_tokens(10, seed=5)
        reference = [event.token_id async for event in client.generate(prompt, short)]
        for attempt in range(150):
            call = client.generate_with_drafts(prompt, short)

            async def keep_drafting(call=call):
                while True:  # a draft every millisecond, until the call is cancelled at its end
                    call.offer(0, [attempt % VOCAB_SIZE] * 2)
                    await asyncio.sleep(0.001)

            drafting = asyncio.create_task(keep_drafting())
            try:
                tokens = [event.token_id async for event in call]
            finally:
                drafting.cancel()
            assert tokens == reference, attempt
    assert await wait_drained(engine)
