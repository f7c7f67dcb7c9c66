"""The local engine over llama.cpp's KV streams (one per sequence slot, llama-server's -np layout).

The real engines here step with budgets of 48 tokens, so every ubatch holds fewer than 64 rows and
llama.cpp's attention stays on its per-row kernel, which walks a sequence's own cells in position
order in either layout: the answers of the two layouts must then be the same tokens, and a prefix
taken over or copied must answer as a prompt computed from scratch.
"""

from __future__ import annotations

import pytest

from cloud_engine.cpu_features import has_native_bf16
from local_runtime.config import LocalEngineConfig
from tests.local_runtime.conftest import QUESTIONS, greedy, make_engine, run_to_completion

NUM_TOKENS = 16
STREAMS = dict(kv_cache_tokens=4096, max_num_seqs=8, max_model_len=512, max_num_batched_tokens=48)


def token_ids(events) -> list[int]:
    return [e.token_id for e in events]


# -- configuration -------------------------------------------------------------------------


def test_auto_takes_streams_only_where_every_slot_fits_max_model_len():
    assert LocalEngineConfig(kv_cache_tokens=16384, max_num_seqs=16, max_model_len=1024).kv_streams
    assert not LocalEngineConfig(kv_cache_tokens=16384, max_num_seqs=16, max_model_len=1025).kv_streams
    # Unset max_model_len counts as the engine's default, min(pool, 4096): 8192 / 16 cells do not hold it.
    assert not LocalEngineConfig().kv_streams
    assert LocalEngineConfig(kv_cache_tokens=16384, max_num_seqs=4).kv_streams
    assert not LocalEngineConfig(
        kv_cache_tokens=16384, max_num_seqs=16, max_model_len=1024, batch_invariant=True
    ).kv_streams
    assert not LocalEngineConfig(
        kv_cache_tokens=16384, max_num_seqs=16, max_model_len=1024, kv_layout="unified"
    ).kv_streams


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(kv_layout="streams"), ["kv_layout", "512 KV cells", "max_model_len (4096)", "65536"]),
        (dict(kv_layout="streams", batch_invariant=True, kv_cache_tokens=65536), ["kv_layout", "batch_invariant"]),
        (dict(kv_layout="paged"), ["kv_layout", "'paged'"]),
    ],
)
def test_a_layout_that_cannot_work_is_refused_with_what_to_change(fields, words):
    with pytest.raises(ValueError) as info:
        LocalEngineConfig(**fields)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_the_setting_reaches_the_engine_config():
    from sdk.settings.fields import SettingsError
    from sdk.settings.loading import load_settings

    assert load_settings(env={"TANDEM_LOCAL_KV_LAYOUT": "unified"}).local_engine_config().kv_layout == "unified"
    assert load_settings(env={}).local_engine_config().kv_layout == "auto"
    with pytest.raises(SettingsError, match="kv_layout"):
        load_settings(env={"TANDEM_LOCAL_KV_LAYOUT": "paged"})


# -- the real engine -----------------------------------------------------------------------

# On an Intel Xeon VM reporting AMX (2026-12-01) and a Zen 4 EPYC with AVX512-BF16 (2026-12-07), a prompt whose
# prefix ran on the BF16 copy alone and one whose suffix ran on the model's own weights after a shared prefix answered
# differently at the sixth greedy token; on the AVX2 AMD machines the suite was measured on they agree
# (docs/local-engine.md, Prefill weights).
BF16_NATIVE = (
    "this CPU lacks the BF16 prefill numerics this comparison was measured on: it has native BF16 dot products (AMX "
    "or AVX512-BF16), where the copy's and the model's own weights flip a near-tie greedy token (docs/local-engine.md)"
)


@pytest.fixture(scope="module", params=["off", "bf16"])
def streams_engine(request):
    """Prompts on the model's own weights, and through the BF16 prefill copy (local_runtime.prefill_context)."""
    engine = make_engine(**STREAMS, prefill_weights=request.param)
    assert engine.config.kv_streams and engine.backend.cells_per_slot == 512
    yield engine
    engine.close()


@pytest.fixture
def prefix_ops(streams_engine, monkeypatch):
    """Every (src slot, dst slot, n) prefix the scheduler hands the engine to copy."""
    calls = []
    schedule = streams_engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        calls.extend(out.prefix_copies)
        return out

    monkeypatch.setattr(streams_engine.scheduler, "schedule", recording_schedule)
    return calls


# On the model's own weights only: prompts moved in from the prefill copy land in the unified pool
# wherever llama.cpp finds room, and attention sums a sequence's cells in cell order there, so the
# two layouts can round differently after a few tokens (docs/local-engine.md "Batch invariance", condition (b)).
@pytest.mark.slow
@pytest.mark.parametrize("streams_engine", ["off"], indirect=True)
def test_streams_answer_as_the_unified_pool_and_batch_in_slot_order(streams_engine, monkeypatch):
    prompts = [streams_engine.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    assert max(len(p) for p in prompts) < 64
    batches = []
    decode = streams_engine.backend.decode
    monkeypatch.setattr(
        streams_engine.backend,
        "decode",
        lambda t, p, slots, *a, **k: (batches.append(slots.copy()), decode(t, p, slots, *a, **k))[1],
    )
    streams_engine.clear_prompt_cache()
    ours = run_to_completion(
        streams_engine, [greedy(f"s{i}", p, NUM_TOKENS, ignore_eos=True) for i, p in enumerate(prompts)]
    )
    assert any(len(set(b.tolist())) == 8 for b in batches), "the eight requests never decoded together"
    for slots in batches:  # llama.cpp batches consecutive streams in one pass only in increasing order
        assert list(slots) == sorted(slots)
    unified = make_engine(**STREAMS, kv_layout="unified", prefill_weights=streams_engine.config.prefill_weights)
    try:
        assert not unified.config.kv_streams
        theirs = run_to_completion(
            unified, [greedy(f"s{i}", p, NUM_TOKENS, ignore_eos=True) for i, p in enumerate(prompts)]
        )
    finally:
        unified.close()
    for i in range(len(prompts)):
        assert token_ids(ours[f"s{i}"]) == token_ids(theirs[f"s{i}"]), f"prompt {i} differs between layouts"
    assert streams_engine.stats().num_kv_blocks_used == 0


@pytest.mark.slow
def test_a_finished_prompts_slot_is_taken_over_and_the_answer_is_unchanged(streams_engine, prefix_ops):
    engine = streams_engine
    engine.clear_prompt_cache()
    first = run_to_completion(
        engine, [greedy("turn-1", engine.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}]), 12)]
    )["turn-1"]
    conversation = [
        {"role": "user", "content": QUESTIONS[0]},
        {"role": "assistant", "content": "".join(e.text for e in first)},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = engine.apply_chat_template(conversation)
    reused = token_ids(run_to_completion(engine, [greedy("turn-2", second, 12, ignore_eos=True)])["turn-2"])
    ((src, dst, n),) = prefix_ops
    assert src == dst and n >= 30, "the second turn should have taken the first turn's slot over"
    engine.clear_prompt_cache()
    engine.scheduler.cache_finished_prompts = False
    try:
        fresh = token_ids(
            run_to_completion(engine, [greedy("turn-2-fresh", second, 12, ignore_eos=True)])["turn-2-fresh"]
        )
    finally:
        engine.scheduler.cache_finished_prompts = True
    assert len(prefix_ops) == 1 and reused == fresh
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.slow
def test_a_running_requests_prefix_is_copied_into_another_stream_and_the_answer_is_unchanged(
    streams_engine, prefix_ops
):
    engine = streams_engine
    if engine.config.prefill_weights == "bf16" and has_native_bf16():
        pytest.skip(BF16_NATIVE)
    system = "You answer in one word. Be exact."
    holder = engine.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]
    )
    sharer = engine.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": "Name a fruit."}]
    )
    engine.clear_prompt_cache()
    engine.scheduler.cache_finished_prompts = False
    try:
        expected = token_ids(run_to_completion(engine, [greedy("solo", sharer, 12, ignore_eos=True)])["solo"])
        assert prefix_ops == []
        engine.add_request(greedy("holder", holder, 40, ignore_eos=True))
        engine.step()
        events = run_to_completion(engine, [greedy("sharer", sharer, 12, ignore_eos=True)])
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.scheduler.cache_finished_prompts = True
    ((src, dst, n),) = prefix_ops
    common = next(i for i, (a, b) in enumerate(zip(holder, sharer)) if a != b)
    assert src != dst and n == common > 16
    assert token_ids(events["sharer"]) == expected
    assert engine.block_manager.num_used_blocks == 0
