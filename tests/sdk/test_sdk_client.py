"""sdk.Client / sdk.AsyncClient over a real local engine and a real gRPC cloud (the
fixtures of tests/sdk/test_cascade.py)."""

from __future__ import annotations

import asyncio

import pytest

from sdk.cascade.runner import CascadeConfig, CascadeRunner
from sdk import AsyncClient, Client
from sdk.cloud.grpc_client import CloudClient
from sdk.protocol.engine import InvalidRequestError
from tests.cloud_engine.grpc_helpers import long_tiny_dir, serve  # noqa: F401  (fixtures)
from tests.sdk.test_cascade import QUESTION, cloud_engine, local_engine, make_runner, recording  # noqa: F401

pytestmark = pytest.mark.slow

GREEDY = {"max_tokens": 12, "temperature": 0.0}


async def test_local_and_cloud_answers_carry_routing(make_runner, recording):  # noqa: F811
    client = AsyncClient(await make_runner())
    local = await client.chat.completions.create(model="local", messages=QUESTION, **GREEDY)
    assert local.object == "chat.completion" and local.choices[0].message.content
    assert local.tandem["tier"] == "local" and local.tandem["reason"] == "forced" and not local.tandem["escalated"]
    assert local.usage.completion_tokens == local.tandem["cost"]["local"]["completion_tokens"]
    assert local.choices[0].finish_reason in ("stop", "length") and recording.received == []
    cloud = await client.chat.completions.create(model="cloud", messages=QUESTION, **GREEDY)
    assert cloud.tandem["tier"] == "cloud" and not cloud.tandem["degraded"] and len(recording.received) == 1
    assert cloud.usage.completion_tokens == cloud.tandem["cost"]["cloud"]["completion_tokens"]
    assert cloud.model_dump()["tandem"]["tier"] == "cloud"  # serializes like the server's responses


@pytest.mark.parametrize("model", ["local", "cloud"])
async def test_stream_joins_to_the_whole_answer(make_runner, model):  # noqa: F811
    client = AsyncClient(await make_runner())
    whole = await client.chat.completions.create(model=model, messages=QUESTION, **GREEDY)
    chunks = [
        c async for c in await client.chat.completions.create(model=model, messages=QUESTION, stream=True, **GREEDY)
    ]
    assert chunks[0].choices[0].delta.role == "assistant" and all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason and last.tandem["tier"] == model
    assert all(c.tandem is None for c in chunks[:-1]) and last.usage == whole.usage


async def test_private_stays_local(make_runner, recording):  # noqa: F811
    client = AsyncClient(await make_runner())
    reply = await client.chat.completions.create(model="cloud", messages=QUESTION, private=True, **GREEDY)
    assert reply.tandem["tier"] == "local" and reply.tandem["privacy_reasons"] == ["private_flag"]
    assert recording.received == []


async def test_bad_arguments_are_refused_before_generation(make_runner, recording):  # noqa: F811
    client = AsyncClient(await make_runner())
    create = client.chat.completions.create
    for kwargs, param in [
        ({"model": "bigger"}, "model"),
        ({"model": "auto:2"}, "model"),
        ({"temperature": 5.0}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"private": "yes"}, "private"),
    ]:
        with pytest.raises(InvalidRequestError) as info:
            await create(**{"model": "local", "messages": QUESTION, **kwargs})
        assert info.value.param == param, kwargs
    with pytest.raises(InvalidRequestError) as info:
        await create(model="local", messages=[], stream=True)
    assert info.value.param == "messages"
    with pytest.raises(TypeError, match="logit_bias"):
        await create(model="local", messages=QUESTION, logit_bias={})
    # Message fields the server refuses are refused in process too (not dropped into prose).
    called = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}  # the legacy API
    with pytest.raises(InvalidRequestError, match="function_call"):
        await create(model="local", messages=[*QUESTION, called])
    assert recording.received == []


async def test_sync_client_streams_and_completes(serve, recording, local_engine):  # noqa: F811
    # The gRPC server runs in this test's loop, so the blocking client runs on a worker thread.
    target = await serve(recording)

    def use_client():
        with Client(CascadeRunner(local_engine, CloudClient(target), CascadeConfig())) as client:
            whole = client.chat.completions.create(model="cloud", messages=QUESTION, **GREEDY)
            with client.chat.completions.create(model="cloud", messages=QUESTION, stream=True, **GREEDY) as stream:
                chunks = list(stream)
            with pytest.raises(InvalidRequestError):
                client.chat.completions.create(model="nope", messages=QUESTION)
            return whole, chunks

    whole, chunks = await asyncio.to_thread(use_client)
    assert whole.tandem["tier"] == "cloud" and chunks[-1].tandem["tier"] == "cloud"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
