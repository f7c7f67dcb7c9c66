"""Edge cases of the cloud engine on a random-weight tiny Llama built in code (fast)."""

from __future__ import annotations

import asyncio

import pytest

from cloud_engine.async_engine import AsyncCloudEngine
from cloud_engine.config import CloudEngineConfig
from cloud_engine.llm import LLM
from sdk.protocol.engine import ContextLengthError, GenerationRequest, InvalidRequestError, SamplingParams
from tests.cloud_engine.tiny_models import random_tokens, save_tiny_llama

BLOCK = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def make_llm(tiny_dir, **overrides) -> LLM:
    # float32: these tests compare recomputed and batched tokens for equality, which bf16 rounding would blur.
    config = dict(
        dtype="float32",
        block_size=BLOCK,
        kv_cache_gb=0.001,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=64,
    )
    config.update(overrides)
    return LLM(tiny_dir, **config)


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return make_llm(tiny_dir)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def test_pool_is_sized_from_the_memory_budget(tiny_dir):
    small, big = make_llm(tiny_dir, kv_cache_gb=0.001), make_llm(tiny_dir, kv_cache_gb=0.002)
    layers, kv_heads, head_dim = 3, 2, 16
    per_block = 2 * layers * BLOCK * kv_heads * head_dim * small.engine.dtype.itemsize
    assert small.engine.num_blocks == int(0.001 * 1024**3) // per_block
    assert big.engine.num_blocks == int(0.002 * 1024**3) // per_block


def test_prompt_exactly_filling_blocks_and_max_tokens_one(llm):
    out = llm.generate([random_tokens(2 * BLOCK, seed=1)], greedy(1))[0]
    assert len(out.token_ids) == 1 and out.finish_reason == "length"
    again = llm.generate([random_tokens(2 * BLOCK, seed=1)], greedy(5))[0]
    assert again.token_ids[0] == out.token_ids[0]
    assert llm.engine.kv_manager.num_used_blocks == 0


def test_stop_string_spanning_tokens_is_never_emitted(llm):
    prompt = random_tokens(10, seed=2)
    free = llm.generate([prompt], greedy(12))[0]
    # The tiny tokenizer's tokens are "w<id>": stop on text spanning the 3rd and 4th tokens.
    third, fourth = (llm.engine.token_text(t) for t in free.token_ids[2:4])
    stop = third[1:] + fourth[:2]
    out = llm.generate([prompt], greedy(12, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert stop not in out.text
    # Exactly the unstopped text up to the first occurrence of the stop string.
    assert out.text == free.text[: free.text.index(stop)]
    assert len(out.token_ids) <= 4


def test_stop_token_ids_end_generation_at_their_first_occurrence(llm):
    prompt = random_tokens(6, seed=3)
    free = llm.generate([prompt], greedy(8))[0]
    stop_id = free.token_ids[2]
    out = llm.generate([prompt], greedy(8, stop_token_ids=[stop_id]))[0]
    assert out.token_ids == free.token_ids[: free.token_ids.index(stop_id) + 1] and out.finish_reason == "stop"


def test_prompt_longer_than_the_context_is_refused_with_nothing_allocated(llm):
    used = llm.engine.kv_manager.num_used_blocks
    with pytest.raises(ContextLengthError, match="maximum context length is 64"):
        llm.generate([random_tokens(60, seed=4)], greedy(10))
    with pytest.raises(InvalidRequestError, match="prompt token ids"):
        llm.generate([[1, 2, 100000]], greedy(2))
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate([[]], greedy(2))
    assert llm.engine.kv_manager.num_used_blocks == used
    assert not llm.engine.has_unfinished_requests()


def test_bad_configs_say_how_to_fix_them(tiny_dir):
    with pytest.raises(ValueError, match="kv-cache-gb"):
        make_llm(tiny_dir, kv_cache_gb=0.00001)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_llm(tiny_dir, enable_chunked_prefill=False, max_num_batched_tokens=32)
    with pytest.raises(TypeError, match="unknown LLM option"):
        make_llm(tiny_dir, max_batch=3)


def test_preemption_under_a_tiny_pool_completes_every_request(tiny_dir):
    roomy = make_llm(tiny_dir, kv_cache_gb=0.01)
    tight = make_llm(tiny_dir, kv_cache_gb=0.0001, max_model_len=40)  # a few dozen blocks: must preempt
    prompts = [random_tokens(12, seed=10 + i) for i in range(4)]
    expected = [o.token_ids for o in roomy.generate(prompts, greedy(24))]
    got = tight.generate(prompts, greedy(24))
    assert tight.engine.scheduler.num_preemptions_total > 0
    assert [len(o.token_ids) for o in got] == [24] * 4
    assert [o.token_ids for o in got] == expected  # recompute gives the same greedy tokens
    assert tight.engine.kv_manager.num_used_blocks == 0


def test_seeded_sampling_is_reproducible_across_batches(llm):
    prompt = random_tokens(8, seed=5)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=42)
    alone = llm.generate([prompt], params)[0].token_ids
    batched = llm.generate([random_tokens(9, seed=6), prompt], [SamplingParams(max_tokens=10), params])[1].token_ids
    assert alone == batched


async def test_async_engine_streams_and_cancel_frees_blocks(tiny_dir):
    engine = AsyncCloudEngine(
        CloudEngineConfig(model=tiny_dir, block_size=BLOCK, kv_cache_gb=0.001, max_model_len=64)
    ).start()
    try:
        await asyncio.to_thread(engine.wait_ready, 60)
        events = [e async for e in engine.generate(GenerationRequest("a", random_tokens(5, seed=7), greedy(6)))]
        assert len(events) == 6 and events[-1].finish_reason == "length"
        stream = engine.generate(GenerationRequest("b", random_tokens(5, seed=8), greedy(50)))
        await anext(stream)
        await stream.aclose()  # the client went away
        for _ in range(100):
            if engine.stats().num_kv_blocks_used == 0 and engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.02)
        assert engine.stats().num_kv_blocks_used == 0
    finally:
        engine.shutdown()


def test_sampling_fields_a_request_leaves_out_come_from_the_models_generation_config(tiny_dir, tmp_path):
    import json
    import shutil

    model_dir = shutil.copytree(tiny_dir, tmp_path / "tiny-greedy-by-default")
    (model_dir / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_p": 0.5}))
    llm = make_llm(str(model_dir), sampling={"top_k": 3})
    assert {k: llm.engine.sampling_defaults.values[k] for k in ("temperature", "top_p", "top_k")} == {
        "temperature": 0.0,
        "top_p": 0.5,
        "top_k": 3,
    }
    assert llm.engine.sampling_defaults.sources["temperature"] == "model: generation_config.json"
    prompt = random_tokens(8, seed=5)
    unset = [llm.generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True))[0].token_ids for _ in range(3)]
    explicit = llm.generate([prompt], greedy(10))[0].token_ids
    assert unset == [explicit] * 3  # temperature 0 from the model: greedy without asking
    # A request's own value still wins: at temperature 1.5 (top_k 3 from the config) the runs differ.
    sampled = {
        tuple(llm.generate([prompt], SamplingParams(max_tokens=10, temperature=1.5, ignore_eos=True))[0].token_ids)
        for _ in range(4)
    }
    assert len(sampled) > 1
