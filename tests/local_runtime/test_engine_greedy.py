"""Greedy output of the real local engine in batch-invariant mode (opt-in): the same alone and
batched, and equal to llama.cpp's own API.

Batch invariance holds while each sequence's KV cells stay in position order, i.e.
while no other request leaves mid-flight and no cached prompt is evicted mid-flight (see
local_runtime/llama_backend.py); the batched requests here therefore all generate the same
number of tokens, and start from an empty prompt cache.
"""

import pytest

from sdk.engine_common.model_files import default_model_path
from tests.local_runtime.conftest import QUESTIONS, greedy, run_to_completion
from tests.local_runtime.reference_llama import load_reference_llama, reference_greedy

pytestmark = pytest.mark.slow
NUM_TOKENS = 24
ENGINE_OVERRIDES = dict(batch_invariant=True)  # what these tests pin (it also leaves the prompt cache off unless asked)


def token_ids(events):
    return [e.token_id for e in events]


def test_greedy_identical_alone_and_batched_with_seven_others(engine, chat_prompts):
    assert len({len(p) for p in chat_prompts}) > 4, "the batch should mix prompt lengths"
    alone = [
        token_ids(run_to_completion(engine, [greedy(f"alone-{i}", p, NUM_TOKENS, ignore_eos=True)])[f"alone-{i}"])
        for i, p in enumerate(chat_prompts)
    ]
    # Otherwise each batched prompt copies its alone run's cells, and evicting those entries to
    # make room frees cells mid-flight: the batch would test the prompt cache, not batching.
    engine.clear_prompt_cache()
    batched = run_to_completion(
        engine, [greedy(f"batch-{i}", p, NUM_TOKENS, ignore_eos=True) for i, p in enumerate(chat_prompts)]
    )
    for i in range(len(chat_prompts)):
        assert token_ids(batched[f"batch-{i}"]) == alone[i], f"prompt {i} diverged when batched"


def test_greedy_identical_to_high_level_llama(engine, chat_prompts):
    reference = load_reference_llama(default_model_path(), n_ctx=512)
    try:
        for i, prompt in enumerate(chat_prompts[:4]):
            ours = token_ids(
                run_to_completion(engine, [greedy(f"ref-{i}", prompt, NUM_TOKENS, ignore_eos=True)])[f"ref-{i}"]
            )
            assert ours == reference_greedy(reference, prompt, NUM_TOKENS), f"prompt {i} differs from llama.cpp's Llama"
    finally:
        reference.close()


def test_text_is_the_tokens_bytes_and_end_of_turn_stops(engine, chat_prompts):
    runs = run_to_completion(engine, [greedy(f"eos-{i}", p, 96) for i, p in enumerate(chat_prompts)])
    stopped = [events for events in runs.values() if events[-1].finish_reason == "stop"]
    assert stopped, "no chat answer ended with an end-of-turn token within 96 tokens"
    for events in stopped:
        assert engine.backend.is_end_of_generation(events[-1].token_id)
        text = "".join(e.text for e in events)
        assert text == b"".join(engine.backend.token_bytes(e.token_id) for e in events[:-1]).decode()
    for events in runs.values():
        assert [e.num_output_tokens for e in events] == list(range(1, len(events) + 1))
        assert all(e.logprob <= 0 and e.entropy >= 0 and 0 <= e.margin <= 1 for e in events)
    assert engine.stats().num_kv_blocks_used == 0


def test_prefix_sharing_reuses_blocks_and_keeps_output(engine, chat_prompts):
    """A second request with the same long prefix shares the first one's cells: every common
    token, the partial block past the last full one included, and the answer is unchanged."""
    system = "You are a terse assistant. " * 12
    first = engine.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]
    )
    second = engine.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": "Name a fruit."}]
    )
    expected = token_ids(run_to_completion(engine, [greedy("solo", second, 12, ignore_eos=True)])["solo"])
    engine.clear_prompt_cache()  # the sharer must find the holder's cells, not the solo run's
    hits_before = engine.stats().num_prefix_cache_hit_tokens_total

    engine.add_request(greedy("holder", first, 40, ignore_eos=True))
    engine.step()  # the holder's prompt is computed and its full blocks published
    events = run_to_completion(engine, [greedy("sharer", second, 12, ignore_eos=True)])
    shared = engine.stats().num_prefix_cache_hit_tokens_total - hits_before
    common = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert common % engine.config.block_size and shared == common >= 64
    assert token_ids(events["sharer"]) == expected
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().num_kv_blocks_used == 0


def test_a_finished_prompt_is_reused_by_the_next_turn_and_the_answer_is_unchanged(engine, chat_prompts):
    """The prompt cache: a chat's second turn copies the first turn's cells (prompt and answer)
    from the finished request's slot, and answers exactly as it does from an empty cache."""
    engine.clear_prompt_cache()
    engine.scheduler.cache_finished_prompts = True  # off in batch-invariant mode unless asked for
    first = run_to_completion(engine, [greedy("turn-1", chat_prompts[0], 12)])["turn-1"]
    answer = "".join(e.text for e in first)  # an end-of-turn token adds no text
    conversation = [
        {"role": "user", "content": QUESTIONS[0]},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And of Italy?"},
    ]
    second_prompt = engine.apply_chat_template(conversation)
    hits_before = engine.stats().num_prefix_cache_hit_tokens_total
    reused = token_ids(run_to_completion(engine, [greedy("turn-2", second_prompt, 12, ignore_eos=True)])["turn-2"])
    shared = engine.stats().num_prefix_cache_hit_tokens_total - hits_before
    assert shared >= len(chat_prompts[0]), "the second turn did not reuse the first turn's prompt"
    assert engine.stats().num_kv_blocks_used == 0 and engine.scheduler.num_cached_blocks > 0
    engine.scheduler.cache_finished_prompts = False
    engine.clear_prompt_cache()
    assert engine.block_manager.num_used_blocks == 0
    fresh = token_ids(
        run_to_completion(engine, [greedy("turn-2-fresh", second_prompt, 12, ignore_eos=True)])["turn-2-fresh"]
    )
    assert reused == fresh
