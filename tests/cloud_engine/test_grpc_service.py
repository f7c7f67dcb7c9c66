"""The tandem.v1 gRPC service over a real cloud engine, through the SDK's CloudClient on loopback."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from sdk.protocol.cloud_backend import CloudStatus
from sdk.protocol.wire import tandem_pb2 as pb
from sdk.protocol.wire import tandem_pb2_grpc as pb_grpc
from sdk.cloud.grpc_client import (
    CloudClient,
    CloudContextLengthError,
    CloudDeadlineExceededError,
    CloudError,
    CloudInvalidArgumentError,
    CloudModel,
    CloudOverloadedError,
    CloudUnavailableError,
    cloud_error,
)
from sdk.protocol.engine import ContextLengthError, EngineOverloadedError, GenerationRequest, SamplingParams
from tests.cloud_engine.grpc_helpers import LONG, MAX_MODEL_LEN, make_engine, wait_drained, wait_until_serving
from tests.cloud_engine.grpc_helpers import engine, long_tiny_dir, serve  # noqa: F401  (fixtures)
from tests.cloud_engine.tiny_models import random_tokens


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


async def test_generate_streams_the_engines_own_tokens(engine, serve):  # noqa: F811  (fixtures)
    prompt = random_tokens(5, seed=1)
    direct = [e async for e in engine.generate(GenerationRequest("direct", prompt, greedy(8, logprobs=2)))]
    async with CloudClient(await serve(engine)) as client:
        events = [e async for e in client.generate(prompt, greedy(8, logprobs=2), request_id="mine")]
        assert [e.token_id for e in events] == [e.token_id for e in direct]
        assert [e.text for e in events] == [e.text for e in direct]
        assert [e.logprob for e in events] == pytest.approx([e.logprob for e in direct], abs=1e-5)
        assert [[t.token_id for t in e.top_logprobs] for e in events] == [
            [t.token_id for t in e.top_logprobs] for e in direct
        ]
        assert all(e.request_id == "mine" and e.finish_reason is None for e in events[:-1])
        last = events[-1]
        assert (last.finish_reason, last.num_prompt_tokens, last.num_output_tokens) == ("length", 5, 8)
        assert (last.num_draft_tokens, last.num_accepted_tokens) == (0, 0)

        # A continuation is read as part of the prompt: greedy decoding goes on where it left off.
        events = [
            e async for e in client.generate(prompt, greedy(5), continuation_token_ids=[e.token_id for e in direct[:3]])
        ]
        assert [e.token_id for e in events] == [e.token_id for e in direct[3:]]
        assert events[-1].num_prompt_tokens == 8

        text = "w5 w6 w7"
        events = [e async for e in client.generate(text, greedy(3))]
        assert events[-1].num_prompt_tokens == len(engine.tokenize(text)) and events[-1].request_id.startswith(
            "tandem-"
        )
        assert await client.list_models() == [CloudModel("tiny", MAX_MODEL_LEN, engine.vocabulary_fingerprint)]
    assert await wait_drained(engine)


async def test_cancel_mid_stream_aborts_and_frees_blocks(engine, serve):  # noqa: F811  (fixtures)
    generated_before = engine.stats().num_generation_tokens_total
    async with CloudClient(await serve(engine)) as client:
        stream = client.generate(random_tokens(5, seed=2), greedy(LONG))
        for _ in range(3):
            await anext(stream)
        assert engine.stats().num_kv_blocks_used > 0
        await stream.aclose()  # cancels the call
        assert await wait_drained(engine), engine.stats()
    assert engine.stats().num_generation_tokens_total - generated_before < LONG  # aborted, not finished


async def test_deadline_exceeded_aborts_and_frees_blocks(engine, serve):  # noqa: F811  (fixtures)
    generated_before = engine.stats().num_generation_tokens_total
    async with CloudClient(await serve(engine), timeout_s=0.2) as client:
        with pytest.raises(CloudDeadlineExceededError) as caught:
            async for _ in client.generate(random_tokens(5, seed=3), greedy(LONG)):
                pass
        assert caught.value.code == CloudStatus.DEADLINE_EXCEEDED
        assert await wait_drained(engine), engine.stats()
    assert engine.stats().num_generation_tokens_total - generated_before < LONG


async def _status_of(target: str, request: pb.GenerateRequest) -> grpc.aio.AioRpcError:
    """Send a raw request (the client's own checks would refuse some of these first)."""
    async with grpc.aio.insecure_channel(target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in pb_grpc.TandemStub(channel).Generate(request):
                pass
    return caught.value


async def test_invalid_requests_are_invalid_argument_naming_the_field(engine, serve):  # noqa: F811  (fixtures)
    target = await serve(engine)
    tokens = pb.TokenIds(ids=[5, 6, 7])
    cases = [
        (pb.GenerateRequest(prompt_token_ids=tokens, sampling=pb.SamplingParams(temperature=-1)), "temperature"),
        (pb.GenerateRequest(prompt_token_ids=tokens, sampling=pb.SamplingParams(top_logprobs=21)), "top_logprobs"),
        (pb.GenerateRequest(prompt_token_ids=tokens, sampling=pb.SamplingParams(max_tokens=0)), "max_tokens"),
        (pb.GenerateRequest(), "prompt"),
        (pb.GenerateRequest(text=""), "text"),
        (pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[5, 10_000])), "prompt"),
        (pb.GenerateRequest(messages=pb.Messages(messages=[pb.ChatMessage(role="user", content="hi")])), "messages"),
    ]
    for request, field in cases:
        error = await _status_of(target, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, error)
        assert f"field: {field}" in error.details()
        mapped = cloud_error(error)
        assert isinstance(mapped, CloudInvalidArgumentError) and mapped.param == field

    async with CloudClient(target) as client:
        with pytest.raises(CloudContextLengthError) as caught:
            await anext(client.generate([5, 6, 7], greedy(MAX_MODEL_LEN)))
        assert isinstance(caught.value, ContextLengthError) and caught.value.param == "max_tokens"
        assert "maximum context length" in str(caught.value)
        with pytest.raises(CloudInvalidArgumentError) as caught:
            await anext(client.generate([], greedy(2)))
        assert caught.value.param == "prompt_token_ids"
        with pytest.raises(CloudInvalidArgumentError) as caught:
            await anext(client.generate([5], greedy(2), model="no-such-model"))
        assert caught.value.code == CloudStatus.NOT_FOUND and caught.value.param == "model"
    assert await wait_drained(engine)


async def test_full_queue_is_resource_exhausted(long_tiny_dir, serve):  # noqa: F811  (fixtures)
    small = make_engine(
        long_tiny_dir, max_num_seqs=1, max_num_batched_tokens=16, max_waiting=0
    )  # one request in flight
    try:
        async with CloudClient(await serve(small)) as client:
            first = client.generate(random_tokens(5, seed=4), greedy(LONG))
            await anext(first)
            with pytest.raises(CloudOverloadedError) as caught:
                await anext(client.generate([5, 6], greedy(2)))
            assert isinstance(caught.value, EngineOverloadedError)
            assert caught.value.code == CloudStatus.RESOURCE_EXHAUSTED and caught.value.retry_after_s >= 1
            await first.aclose()
            assert await wait_drained(small)
            events = [e async for e in client.generate([5, 6], greedy(2))]  # room again
            assert events[-1].finish_reason == "length"
    finally:
        small.shutdown()


async def test_message_over_the_size_limit_is_refused_by_grpc(engine, serve):  # noqa: F811  (fixtures)
    async with CloudClient(await serve(engine, max_message_bytes=1024)) as client:
        with pytest.raises(CloudError) as caught:
            await anext(client.generate("w5 " * 2000, greedy(2)))
        assert caught.value.code == CloudStatus.RESOURCE_EXHAUSTED
        assert not isinstance(caught.value, CloudOverloadedError)  # gRPC's limit, not the engine's queue
        events = [e async for e in client.generate("w5 w6", greedy(2))]
        assert events[-1].finish_reason == "length"


async def test_health_turns_serving_when_the_engine_is_ready(long_tiny_dir, serve):  # noqa: F811  (fixtures)
    late = make_engine(long_tiny_dir, start=False)
    try:
        async with CloudClient(await serve(late)) as client:
            assert await client.health() == "NOT_SERVING"
            assert await client.health("tandem.v1.Tandem") == "NOT_SERVING"
            with pytest.raises(CloudUnavailableError):
                await anext(client.generate([5, 6], greedy(2)))
            late.start()
            await asyncio.to_thread(late.wait_ready, 120)
            assert await wait_until_serving(client)
            assert await client.health("tandem.v1.Tandem") == "SERVING"
            events = [e async for e in client.generate([5, 6], greedy(2))]
            assert events[-1].finish_reason == "length"
    finally:
        late.shutdown()


async def test_unreachable_server_is_unavailable():
    async with CloudClient("127.0.0.1:1", timeout_s=5) as client:
        with pytest.raises(CloudUnavailableError) as caught:
            await client.list_models()
        assert caught.value.code == CloudStatus.UNAVAILABLE and "127.0.0.1:1" in str(caught.value)


async def test_repetition_stop_travels_both_ways(engine, serve):  # noqa: F811  (fixtures)
    """Off on the cloud engine unless asked; asked, it stops where the rule fires and says so."""
    from sdk.engine_common.repetition import STOP_LOOP, find_loop

    prompt = random_tokens(5, seed=3)
    params = SamplingParams(max_tokens=400, temperature=0.0)
    unset = [e async for e in engine.generate(GenerationRequest("unset", prompt, params))]
    tokens = [e.token_id for e in unset]
    found = find_loop(tokens, STOP_LOOP)
    assert found is not None, "a random-weight model decoding greedily falls into a cycle"
    assert unset[-1].stop_reason is None  # the cloud engine's default: off
    async with CloudClient(await serve(engine)) as client:
        asked = [
            e
            async for e in client.generate(
                prompt, SamplingParams(max_tokens=400, temperature=0.0, repetition_stop=True)
            )
        ]
    assert [e.token_id for e in asked] == tokens[: found[0]]
    assert (asked[-1].finish_reason, asked[-1].stop_reason) == ("length", "repetition")
    assert await wait_drained(engine)
