"""The cloud engine's greedy tokens on the real SmolLM2 weights: equal to HF transformers, and
independent of batching, chunking and prefix caching."""

from __future__ import annotations


import pytest

from cloud_engine.llm import LLM
from sdk.engine_common.model_files import default_model_path
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.hf_reference import transformers_greedy
from tests.local_runtime.conftest import QUESTIONS

pytestmark = pytest.mark.slow
NUM_TOKENS = 24


def greedy(n: int = NUM_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    # float32 like the HF reference: equality is exact only at the same precision.
    return LLM(None, dtype="float32", kv_cache_gb=0.25, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024)


@pytest.fixture(scope="module")
def prompts(llm):
    return [llm.engine.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def hf_tokens(prompts):
    return transformers_greedy(default_model_path(), prompts, NUM_TOKENS)


def test_greedy_matches_transformers_alone(llm, prompts, hf_tokens):
    for prompt, expected in zip(prompts, hf_tokens):
        assert llm.generate([prompt], greedy())[0].token_ids == expected


def test_greedy_matches_transformers_batched_together(llm, prompts, hf_tokens):
    outs = llm.generate(prompts, greedy())
    assert [o.token_ids for o in outs] == hf_tokens
    assert llm.engine.kv_manager.num_used_blocks == 0


def test_chunked_prefill_matches_unchunked(prompts):
    long_prompt = [t for p in prompts for t in p][:300]
    results = []
    # The short request decodes while the long prompt prefills, so the paced mode (a 1 ms
    # target, a long step now and then) splits it into chunks of several sizes.
    for overrides in (
        dict(max_num_batched_tokens=16),
        dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
        dict(max_num_batched_tokens=256, step_time_target_ms=1.0, step_time_max_ms=30.0, slow_step_share=0.3),
    ):
        engine_llm = LLM(
            None,
            dtype="float32",
            kv_cache_gb=0.1,
            max_num_seqs=8,
            max_model_len=512,
            enable_prefix_caching=False,
            **overrides,
        )
        results.append([o.token_ids for o in engine_llm.generate([prompts[0], long_prompt], greedy())])
    assert results[0] == results[1] == results[2]


def test_prefix_cache_hit_gives_the_tokens_of_a_miss(llm, prompts):
    system = [t for p in prompts for t in p][:160]  # ten full blocks shared by both requests
    first = llm.generate([system + prompts[0]], greedy())[0]
    hits_before = llm.engine.kv_manager.num_prefix_cache_hits_total
    second = llm.generate([system + prompts[0]], greedy())[0]
    assert llm.engine.kv_manager.num_prefix_cache_hits_total - hits_before >= 160
    assert second.token_ids == first.token_ids


def test_stream_text_equals_detokenised_tokens(llm, prompts):
    out = llm.generate([prompts[1]], SamplingParams(max_tokens=40, temperature=0.0))[0]
    assert out.text == llm.engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert out.finish_reason in ("stop", "length")


def test_tokenize_keeps_special_token_text_plain_with_or_without_bos(llm):
    im_start = llm.engine.tokenizer.convert_tokens_to_ids("<|im_start|>")
    for add_special in (True, False):
        assert im_start not in llm.engine.tokenize("<|im_start|>user hi", add_special=add_special)
    assert im_start in llm.engine.apply_chat_template([{"role": "user", "content": "hi"}])
