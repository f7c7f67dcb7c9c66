"""Prompts prefilled through a 16-bit copy of the weights (local_runtime.prefill_weights, prefill_context).

The cells a prompt leaves must be the ones the main context would have computed from the same
weights: with the copy pointed at the model file itself, a request run alone answers token for
token, logprob for logprob, as on the model's own path (fresh, after a prefix taken over or
shared, and in chunks). With the real BF16 copy, the first token's distribution must be closer to
the model's dequantized weights (an F16 copy, within 1e-5 of F32 in a probe) than llama.cpp's own
Q4_1 kernels, which quantize the activations to 8 bits, get.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from cloud_engine.cpu_features import has_native_bf16
from local_runtime import kv_state
from local_runtime.config import LocalEngineConfig
from local_runtime.prefill_weights import prefill_copy_path
from sdk.engine_common.model_files import default_model_path
from tests.local_runtime.conftest import (
    QUESTIONS,
    assert_no_blocks_held,
    chunks_in_main,
    greedy,
    make_engine,
    own_file_as_copy,
    run_to_completion,
)

STREAMS = dict(kv_cache_tokens=4096, max_num_seqs=8, max_model_len=512)
UNIFIED = dict(kv_cache_tokens=2048, max_num_seqs=8, max_model_len=512, kv_layout="unified")
LONG = "Summarize this list: " + ", ".join(f"item {i} weighs {i * 7 % 13} kg" for i in range(30))


# -- the state bytes, between stream counts -------------------------------------------------------


def state(n_streams: int, stream: int, payload: bytes) -> bytes:
    head = struct.pack("<Ii", 0xAF143CD8, stream)
    counts = [struct.pack("<I", 0)] * n_streams
    counts[stream] = payload
    return head + struct.pack("<I", n_streams) + b"".join(counts)


def test_a_streams_state_becomes_one_stream_and_back():
    payload = struct.pack("<I", 3) + bytes(range(40))  # 3 cells and their bytes
    many = state(8, 5, payload)
    one = kv_state.to_one_stream(memoryview(many), 8, 5)
    assert one == many[:8] + struct.pack("<I", 1) + payload
    back = kv_state.from_one_stream(one, 8)
    assert struct.unpack_from("<I", back, 8)[0] == 8 and back[12 : 12 + len(payload)] == payload
    assert back[12 + len(payload) :] == bytes(4 * 7)
    assert kv_state.from_one_stream(one, 1) == one and kv_state.to_one_stream(one, 1, 0) == one


def test_state_bytes_that_do_not_fit_the_layout_are_refused():
    many = state(8, 5, struct.pack("<I", 1) + b"x" * 8)
    with pytest.raises(ValueError, match="streams, expected 4"):
        kv_state.to_one_stream(many, 4, 5)
    with pytest.raises(ValueError, match="outside stream 2"):
        kv_state.to_one_stream(many, 8, 2)
    with pytest.raises(ValueError, match="one stream"):
        kv_state.from_one_stream(many, 8)


# -- the setting ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, words",
    [
        (dict(prefill_weights="int8"), ["prefill_weights", "'int8'"]),
        (dict(prefill_weights="bf16", batch_invariant=True), ["prefill_weights", "batch_invariant"]),
        (dict(prefill_weights="f16", n_gpu_layers=10), ["prefill_weights", "n_gpu_layers"]),
    ],
)
def test_settings_the_copy_cannot_honour_are_refused(config, words):
    with pytest.raises(ValueError) as caught:
        LocalEngineConfig(**config)
    assert all(word in str(caught.value) for word in words)
    assert not LocalEngineConfig(batch_invariant=True).may_prefill_on_copy  # auto stays off there


@pytest.mark.slow
def test_the_copy_is_converted_once_and_is_bf16(tmp_path, monkeypatch):
    from local_runtime.llama_backend import LlamaBackend, LlamaBackendConfig

    monkeypatch.setenv("TANDEM_PREFILL_WEIGHTS_DIR", str(tmp_path))
    path = prefill_copy_path(default_model_path(), "bf16")
    inode = (tmp_path / path.rsplit("/", 1)[-1]).stat().st_ino
    assert prefill_copy_path(default_model_path(), "bf16") == path
    assert (tmp_path / path.rsplit("/", 1)[-1]).stat().st_ino == inode  # not converted (and renamed in) again
    assert [p.name for p in tmp_path.iterdir()] == [path.rsplit("/", 1)[-1]]  # no partial file left
    copy = LlamaBackend(LlamaBackendConfig(path, 256, 1, 64, 2))
    try:
        assert copy.metadata("general.file_type") == "32"  # LLAMA_FTYPE_MOSTLY_BF16
    finally:
        copy.close()


# -- the moves of cells -----------------------------------------------------------------------


def answers_one_at_a_time(engine, prompts, max_tokens=12, empty_pool_before=()):
    """Each prompt alone (earlier ones cached, unless its index is in `empty_pool_before`), greedy:
    [(token, logprob)] per prompt."""
    out = []
    for i, prompt in enumerate(prompts):
        if i in empty_pool_before:
            engine.clear_prompt_cache()
        events = run_to_completion(engine, [greedy(f"r{i}", prompt, max_tokens, ignore_eos=True)])[f"r{i}"]
        out.append([(e.token_id, e.logprob) for e in events])
    return out


def prefill_context_is_empty(engine) -> bool:
    return all(engine.prefill.backend.slot_max_position(slot) == -1 for slot in range(engine.config.max_num_seqs))


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", [STREAMS, UNIFIED, STREAMS | dict(kv_cache_type="q8_0")], ids=["streams", "unified", "streams-q8_0"]
)
@pytest.mark.parametrize("budget", [512, 48], ids=["whole", "chunked"])
def test_cells_moved_from_the_prefill_context_answer_as_the_main_context_computes(layout, budget):
    reference = chunks_in_main(make_engine(**layout, max_num_batched_tokens=budget, prefill_weights="bf16"))
    moved = own_file_as_copy(make_engine(**layout, max_num_batched_tokens=budget, prefill_weights="bf16"))
    try:
        first = moved.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}])
        turns = [
            {"role": "user", "content": QUESTIONS[0]},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
        ]
        follow = moved.apply_chat_template(turns)
        prompts = [first, follow, moved.apply_chat_template([{"role": "user", "content": LONG}])]
        assert len(prompts[2]) > 2 * 48  # chunked three ways at the small budget
        starts = []
        prefill = moved.prefill.prefill
        moved.prefill.prefill = lambda chunks: (starts.extend(c.start for c in chunks), prefill(chunks))
        # The long prompt starts from an empty pool: in the unified one, cells moved in land where
        # llama.cpp finds room and a decode's wherever cells are free, and around cached prompts
        # those differ, which changes attention's rounding (docs/local-engine.md "Batch invariance").
        ours, theirs = (answers_one_at_a_time(e, prompts, empty_pool_before=(2,)) for e in (moved, reference))
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert [t for t, _ in a] == [t for t, _ in b], f"prompt {i}: other tokens"
            assert np.allclose([lp for _, lp in a], [lp for _, lp in b], atol=1e-4), f"prompt {i}: other logprobs"
        assert any(start >= 30 for start in starts), "the follow-up should have loaded the first turn's cells"
        assert prefill_context_is_empty(moved)
        assert_no_blocks_held(moved)
    finally:
        reference.close()
        moved.close()


@pytest.mark.slow
def test_prompts_past_the_prefill_contexts_room_run_in_the_main_context():
    own = make_engine(**STREAMS, max_num_batched_tokens=512, prefill_weights="off")
    moved = own_file_as_copy(make_engine(**STREAMS, max_num_batched_tokens=512, prefill_weights="bf16"))
    try:
        prompt = own.apply_chat_template([{"role": "user", "content": LONG}])
        moved.prefill.n_cells = len(prompt) - 2  # all but the last token do not fit: the main context takes the prompt
        runs = []
        decode = moved.prefill.backend.decode
        moved.prefill.backend.decode = lambda *a, **k: (runs.append(1), decode(*a, **k))[1]
        assert answers_one_at_a_time(moved, [prompt]) == answers_one_at_a_time(own, [prompt])
        assert runs == []
    finally:
        own.close()
        moved.close()


@pytest.mark.slow
def test_a_request_aborted_mid_prompt_leaves_no_cells_in_either_context():
    engine = make_engine(**STREAMS, max_num_batched_tokens=48, prefill_weights="bf16")
    try:
        assert engine.prefill is not None
        prompt = engine.apply_chat_template([{"role": "user", "content": LONG}])
        engine.add_request(greedy("cut", prompt, 8))
        engine.step()
        request = engine.scheduler.requests["cut"]
        slot = request.slot
        assert 0 < request.num_computed_tokens < len(prompt)
        assert engine.backend.slot_max_position(slot) == request.num_computed_tokens - 1  # the chunk moved over
        assert prefill_context_is_empty(engine)
        assert engine.abort_request("cut")
        engine.clear_prompt_cache()
        assert engine.backend.slot_max_position(slot) == -1
        assert_no_blocks_held(engine)
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.skipif(
    has_native_bf16(),
    reason="this CPU lacks the kernels this figure was measured on: it has native BF16 dot products (AMX or "
    "AVX512-BF16), where the BF16 copy's error was 0.81 of llama.cpp's Q4_1 kernels', not under a third "
    "(docs/local-engine.md)",
)
def test_the_bf16_prefill_is_closer_to_the_dequantized_weights_than_llama_cpps_q4_1_kernels():
    """KL(reference || path) of the first token, where the reference prefills through an F16 copy."""
    paths = {name: make_engine(**STREAMS, prefill_weights=name) for name in ("off", "bf16", "f16")}
    try:
        assert paths["bf16"].prefill.kind == "bf16" and paths["f16"].prefill.kind == "f16"
        kl = {"off": [], "bf16": []}
        for question in QUESTIONS:
            prompt = paths["off"].apply_chat_template([{"role": "user", "content": question}])
            first = {}
            for name, engine in paths.items():
                engine.add_request(greedy(name, prompt, 1, logprobs=20))
                while engine.has_unfinished_requests():
                    for event in engine.step():
                        first[name] = {t.token_id: t.logprob for t in event.top_logprobs}
            reference = first["f16"]
            for name in kl:
                common = [t for t in reference if t in first[name]]
                p = np.exp([reference[t] for t in common])
                kl[name].append(
                    float(np.sum(p * (np.array([reference[t] for t in common]) - [first[name][t] for t in common])))
                )
        assert np.mean(kl["bf16"]) < np.mean(kl["off"]) / 3, kl
    finally:
        for engine in paths.values():
            engine.close()
