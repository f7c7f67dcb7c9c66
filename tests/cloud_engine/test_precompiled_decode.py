"""The decode step compiled ahead of time and loaded at start ([cloud] compile = auto, cloud_engine.precompiled_decode).

Without a saved step an auto engine is eager and says how to make one; `precompile` saves it; the next engine with the
same settings loads it and answers as the eager engine does (float32: identical greedy tokens), while an engine of
other sizes, or a damaged file, starts eager with the reason and never fails.
"""

from __future__ import annotations

import pytest

import cloud_engine.compiled_decode
import cloud_engine.engine
from cloud_engine.llm import LLM
from cloud_engine.precompiled_decode import artifact_path
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.kernel_helpers import built_cpu_kernels
from tests.cloud_engine.tiny_models import random_tokens, save_tiny_llama


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A cache of its own, and compile = auto as written (the folder's forced-compile fixture let go of)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(cloud_engine.engine, "resolve_compile", cloud_engine.compiled_decode.resolve_compile)
    return tmp_path / "inductor"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-precompiled"))


def make_llm(model_dir, **overrides) -> LLM:
    config = dict(
        dtype="float32", block_size=4, kv_cache_gb=0.002, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=96
    )
    return LLM(model_dir, **{**config, **overrides})


def tokens(llm: LLM) -> list[list[int]]:
    prompts = [random_tokens(n, seed=n) for n in (3, 11, 26)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in llm.generate(prompts, params)]


@pytest.mark.parametrize("weight_dtype", ["auto", "int8"])
def test_auto_loads_the_precompiled_step_and_answers_as_eager_steps(tiny_dir, cache_dir, weight_dtype):
    built_cpu_kernels()
    eager = make_llm(tiny_dir, weight_dtype=weight_dtype)
    assert not eager.engine.compiled and eager.engine.runner.compiled_decode is None
    expected = tokens(eager)
    path, _ = eager.engine.precompile()
    assert path == str(artifact_path(eager.engine)) and artifact_path(eager.engine).exists()

    loaded = make_llm(tiny_dir, weight_dtype=weight_dtype)
    assert loaded.engine.compiled and loaded.engine.runner.compiled_decode._precompiled is not None
    assert tokens(loaded) == expected
    # a pool of another size (by default a share of the memory free at start) takes the same step
    other_pool = make_llm(tiny_dir, weight_dtype=weight_dtype, kv_cache_gb=0.003)
    assert other_pool.engine.compiled and other_pool.engine.num_blocks != loaded.engine.num_blocks
    assert tokens(other_pool) == expected
    # other buffer sizes are another key: no file, so eager
    assert not make_llm(tiny_dir, weight_dtype=weight_dtype, max_model_len=64).engine.compiled


def test_a_damaged_precompiled_step_leaves_the_engine_eager(tiny_dir, cache_dir, caplog):
    built_cpu_kernels()
    llm = make_llm(tiny_dir)
    path = artifact_path(llm.engine)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a compiled function")
    with caplog.at_level("INFO", logger="cloud_engine.engine"):
        again = make_llm(tiny_dir)
    assert not again.engine.compiled
    assert "could not be loaded" in caplog.text
    assert len(tokens(again)[0]) == 12


def test_precompiling_is_refused_where_a_saved_step_would_not_be_used(tiny_dir, cache_dir):
    with pytest.raises(ValueError, match="precompiling needs compile = auto"):
        make_llm(tiny_dir, compile="off").engine.precompile()
