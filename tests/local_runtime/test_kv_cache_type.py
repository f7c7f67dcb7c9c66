"""The device's KV cells in 8 and 4 bits ([local] kv_cache_type, llama.cpp's type_k / type_v).

What must hold in any cell type: the setting is refused where llama.cpp cannot honour it, the pool's
bytes are what llama.cpp stores, and the engine's books (prefix sharing, the prompt cache, preemption,
the prefill copy's moves of cells) work as in f16. What a type costs in answers is a measurement,
not a test: bench.kv_precision.
"""

from __future__ import annotations

import numpy as np
import pytest

from local_runtime.config import LocalEngineConfig
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig
from sdk.engine_common.model_files import default_model_path
from tests.local_runtime.conftest import greedy, make_engine, run_to_completion

# The engine and chat_prompts fixtures of this module run in q8_0 (tests/local_runtime/conftest.py), and so do
# these tests, collected here again from the modules that pin them in f16.
from tests.local_runtime.test_engine_greedy import (  # noqa: F401
    test_a_finished_prompt_is_reused_by_the_next_turn_and_the_answer_is_unchanged,
    test_greedy_identical_alone_and_batched_with_seven_others,
    test_prefix_sharing_reuses_blocks_and_keeps_output,
)

# As test_engine_greedy's (batch-invariant: the guarantee its tests pin, which holds in q8_0 cells too), in q8_0.
ENGINE_OVERRIDES = {"batch_invariant": True, "kv_cache_type": "q8_0"}


@pytest.mark.parametrize(
    "config, words",
    [
        (dict(kv_cache_type="q5_1"), ["kv_cache_type", "'q5_1'", "f16, q8_0, q4_0"]),
        (dict(kv_cache_type="q8_0", flash_attn=False), ["kv_cache_type", "'q8_0'", "flash_attn"]),
        (dict(kv_cache_type="q4_0", flash_attn=False), ["kv_cache_type", "'q4_0'", "flash_attn"]),
    ],
)
def test_cell_types_llama_cpp_cannot_honour_are_refused_by_name(config, words):
    with pytest.raises(ValueError) as caught:
        LocalEngineConfig(**config)
    assert all(word in str(caught.value) for word in words)
    LocalEngineConfig(kv_cache_type="f16", flash_attn=False)  # f16 cells need no flash attention


def state_bytes(backend: LlamaBackend, num_tokens: int) -> int:
    """Bytes of a slot's sequence state holding `num_tokens` cells."""
    backend.clear_all()
    n = num_tokens
    backend.decode(
        np.arange(100, 100 + n, dtype=np.int32),
        np.arange(n, dtype=np.int32),
        np.zeros(n, dtype=np.int32),
        np.zeros(n, dtype=np.int8),
    )
    return len(backend.read_sequence(0))


@pytest.mark.slow
def test_the_bytes_a_cell_is_counted_at_are_what_llama_cpp_stores():
    """kv_bytes_per_cell (the pool's bytes in stats and /health) against llama.cpp's own sequence state:
    64 more cells add 64 x (the cell's K and V rows + its position, sequence count and id: 12 bytes)."""
    per_cell = {}
    for kind in ("f16", "q8_0", "q4_0"):
        backend = LlamaBackend(LlamaBackendConfig(default_model_path(), 512, 1, 256, 2, kv_cache_type=kind))
        try:
            grown = state_bytes(backend, 128) - state_bytes(backend, 64)
            per_cell[kind] = backend.kv_bytes_per_cell
            assert grown == 64 * (per_cell[kind] + 12), kind
        finally:
            backend.close()
    assert per_cell["f16"] / per_cell["q8_0"] == pytest.approx(32 / 17)  # 34 bytes per 32 values against 64
    assert per_cell["f16"] / per_cell["q4_0"] == pytest.approx(64 / 18)


@pytest.mark.slow
def test_stats_report_the_pools_type_and_tokens_per_gib(engine):
    stats = engine.stats()
    assert stats.kv_cache_dtype == "q8_0" and stats.kv_cache_tokens_total == engine.config.pool_tokens
    assert stats.kv_cache_bytes_total == engine.config.pool_tokens * engine.backend.kv_bytes_per_cell
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 values for K and for V, in 2 x 6 blocks of 34 bytes.
    assert stats.kv_tokens_per_gib == pytest.approx(2**30 / (30 * 2 * 6 * 34))


@pytest.mark.slow
def test_preemption_in_q8_0_keeps_every_request_and_frees_every_block(chat_prompts):
    """Six requests that cannot all fit 12 blocks: preempted, recomputed, finished, and nothing held after."""
    tight = make_engine(kv_cache_tokens=192, max_model_len=128, max_num_seqs=6, kv_cache_type="q8_0")
    try:
        requests = [greedy(f"r{i}", p, 40, ignore_eos=True) for i, p in enumerate(chat_prompts[:6])]
        got = run_to_completion(tight, requests)
        stats = tight.stats()
    finally:
        tight.close()
    assert stats.num_preemptions_total > 0, "the pool was meant to run out"
    assert all(len(events) == 40 and events[-1].finish_reason == "length" for events in got.values())
    assert stats.num_kv_blocks_used == 0
