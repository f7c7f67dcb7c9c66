"""bench.compiled_step's compute side of the roofline: a step's arithmetic counted from the model's shapes, and the
profile that splits a step's time between linears, attention and the rest (issue 70's shortfall explained)."""

from __future__ import annotations

import pytest

from bench.compiled_step import _start_decoding, profile_step, step_flops, weight_elements
from cloud_engine.llm import LLM
from tests.cloud_engine.tiny_models import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def make_llm(tiny_dir, **overrides) -> LLM:
    config = dict(dtype="float32", compile="off", kv_cache_gb=0.002, max_num_seqs=4, max_model_len=128)
    return LLM(tiny_dir, **{**config, **overrides})


def multiply_adds_per_row(config) -> int:
    """What a Llama layer's shapes say, independent of how the engine stores its linears: attention's four
    projections, the gated MLP's three, and the LM head (the tied embedding)."""
    hidden, heads, kv_heads, head_dim = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * config.intermediate_size
    return config.num_hidden_layers * (attention + mlp) + config.vocab_size * hidden


@pytest.mark.parametrize("weight_dtype", ["auto", "int8"])
def test_weight_elements_count_every_linear_and_the_head(tiny_dir, weight_dtype):
    engine = make_llm(tiny_dir, weight_dtype=weight_dtype).engine
    assert weight_elements(engine) == multiply_adds_per_row(engine.model_config)


def test_step_flops_count_the_linears_per_row_and_attention_per_context_token(tiny_dir):
    engine = make_llm(tiny_dir).engine
    ids = _start_decoding(engine, 2, prompt_len=10)
    config = engine.model_config
    contexts = [engine.scheduler.requests[rid].num_computed_tokens + 1 for rid in ids]
    attention = 4 * config.num_attention_heads * config.head_dim * config.num_hidden_layers * sum(contexts)
    assert step_flops(engine, ids) == 2 * 2 * multiply_adds_per_row(config) + attention
    engine.abort_all()


def test_profile_splits_a_compiled_step_into_linears_attention_and_the_rest(tiny_dir):
    engine = make_llm(tiny_dir, compile="on").engine
    ids = _start_decoding(engine, 2, prompt_len=10)
    profile = profile_step(engine.runner, engine, ids, steps=3)
    engine.abort_all()
    assert profile["linear_ms"] > 0 and profile["attention_ms"] > 0
    assert profile["linear_ms"] + profile["attention_ms"] < profile["step_ms"]
    assert profile["other_ms"] == pytest.approx(
        profile["step_ms"] - profile["linear_ms"] - profile["attention_ms"], abs=0.02
    )
    assert profile["top_ops_ms"] and all(ms >= 0 for ms in profile["top_ops_ms"].values())
