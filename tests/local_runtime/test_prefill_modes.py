"""The local tier's two prefill modes: llama.cpp's own (the default) and batch-invariant (opt-in).

By default a prompt goes through llama.cpp in ubatches of its default size (llama-server's -ub),
and a finished prompt stays cached, so the next one reuses the chat template's head and a chat's
next turn reuses the conversation (llama-server's cache_prompt). batch_invariant keeps ubatches at
63 tokens (the per-row attention kernel) and leaves the prompt cache off unless asked for.
"""

from __future__ import annotations

import llama_cpp
import pytest

from local_runtime.config import LocalEngineConfig
from tests.local_runtime.conftest import assert_no_blocks_held, greedy, make_engine, run_to_completion


def test_the_prompt_cache_follows_the_mode_unless_set():
    assert LocalEngineConfig().cache_finished_prompts is True
    assert LocalEngineConfig(batch_invariant=True).cache_finished_prompts is False
    assert LocalEngineConfig(batch_invariant=True, cache_finished_prompts=True).cache_finished_prompts is True
    assert LocalEngineConfig(cache_finished_prompts=False).cache_finished_prompts is False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("batch_invariant", "n_batch", "n_ubatch"), [(False, 256, 256), (False, 1024, 512), (True, 256, 63)]
)
def test_ubatch_size_per_mode(batch_invariant, n_batch, n_ubatch):
    """llama.cpp's default ubatch (512) caps a larger step budget: its compute buffers do not grow with it."""
    engine = make_engine(batch_invariant=batch_invariant, max_num_batched_tokens=n_batch)
    try:
        assert llama_cpp.llama_n_ubatch(engine.backend.ctx) == n_ubatch
        assert llama_cpp.llama_n_batch(engine.backend.ctx) == n_batch
    finally:
        engine.close()


@pytest.mark.slow
def test_by_default_a_new_prompt_reuses_the_chat_templates_head():
    """Unrelated questions one after another (one client): the second computes only what follows the
    template's common head, as llama-server's slot cache does; its blocks are not held afterwards."""
    engine = make_engine()
    try:
        first = engine.apply_chat_template([{"role": "user", "content": "Who wrote Hamlet?"}])
        second = engine.apply_chat_template([{"role": "user", "content": "Name a prime number above ten."}])
        head = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
        assert head >= 8, "the chat template should give both prompts a common head"
        run_to_completion(engine, [greedy("first", first, 4)])
        hits = engine.stats().num_prefix_cache_hit_tokens_total
        events = run_to_completion(engine, [greedy("second", second, 4)])["second"]
        assert engine.stats().num_prefix_cache_hit_tokens_total - hits == head
        assert events[-1].finish_reason is not None
        assert_no_blocks_held(engine)
    finally:
        engine.close()
