"""Compiled decode steps ([cloud] compile, cloud_engine.compiled_decode) on a random-weight tiny Llama.

Padded rows must never write a live KV slot nor change a live row's output; compiled steps must
give what eager steps give (float32: the same tokens, logits within rounding); one graph must
serve every bucket. The 135M model's greedy check is the slow test at the end.
"""

from __future__ import annotations

import pytest
import torch

from cloud_engine.compiled_decode import decode_buckets, resolve_compile
from cloud_engine.config import CloudEngineConfig
from cloud_engine.llm import LLM
from cloud_engine.model.packed_linear import row_bucket
from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.cloud_engine.tiny_models import random_tokens, save_tiny_llama

BLOCK = 4
BACKENDS = ["auto", "torch"]  # the CPU kernel's op (tandem_cpu::write_and_attend), the portable op


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-compiled"))


def make_llm(tiny_dir, compile: str, attention_backend: str = "auto") -> LLM:
    return LLM(
        tiny_dir,
        dtype="float32",
        block_size=BLOCK,
        kv_cache_gb=0.002,
        max_num_seqs=32,
        max_num_batched_tokens=64,
        max_model_len=128,
        compile=compile,
        attention_backend=attention_backend,
    )


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request, tiny_dir):
    """(compiled, eager) engines on the same weights and attention backend."""
    return make_llm(tiny_dir, "on", request.param), make_llm(tiny_dir, "off", request.param)


def start_decoding(llm: LLM, prompts: list[list[int]]) -> list[str]:
    """Add the prompts and step until every one has its first token (prefill done); their ids."""
    engine = llm.engine
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
        engine.add_request(GenerationRequest(rid, prompt, params))
    while any(engine.scheduler.requests[rid].num_output_tokens == 0 for rid in ids):
        engine.step()
    return ids


def decode_batch(llm: LLM, ids: list[str]):
    engine = llm.engine
    for rid in ids:
        assert engine.kv_manager.allocate_slots(engine.scheduler.requests[rid], 1) is not None
    return engine.runner.prepare(dict.fromkeys(ids, 1), engine.scheduler.requests, engine.kv_manager.get_block_ids)


def caches(llm: LLM) -> list[torch.Tensor]:
    return [t.clone() for layer in llm.engine.runner.model.model.layers for t in layer.self_attn.kv_cache]


def test_buckets_cover_every_batch_and_need_no_further_padding():
    for max_num_seqs in (1, 2, 3, 8, 9, 32, 100, 256):
        buckets = decode_buckets(max_num_seqs)
        assert buckets == sorted(set(buckets)) and buckets[0] == 2 and buckets[-1] >= max(2, max_num_seqs)
        assert len(buckets) == 1 or buckets[-2] < max_num_seqs  # no bucket only bigger batches than allowed use
        assert all(row_bucket(b) == b for b in buckets)  # packed linears' own buckets: no second padding


def test_padded_rows_write_only_the_pad_block_and_leave_live_rows_alone(pair):
    compiled, eager = pair
    prompts = [random_tokens(n, seed=n) for n in (5, 9, 13)]  # 3 rows: a bucket of 4, one pad row
    batches, before, logits = [], [], []
    for llm in (compiled, eager):
        ids = start_decoding(llm, prompts)
        batches.append(decode_batch(llm, ids))
        before.append(caches(llm))
        logits.append(llm.engine.runner.execute(batches[-1]))
    assert batches[0].compiled_bucket == 4 and not batches[1].compiled_bucket
    engine = compiled.engine
    live_slots = batches[0].attn_metadata.slot_mapping[:3].tolist()
    pad_slots = set(range(engine.num_blocks * BLOCK, (engine.num_blocks + 1) * BLOCK))
    live_blocks = {b for rid in engine.scheduler.requests for b in engine.kv_manager.get_block_ids(rid)}
    assert 0 in live_blocks  # so a pad row writing slot 0 (block 0) would be caught below
    for old, new in zip(before[0], caches(compiled)):
        slots_changed = (old != new).reshape(old.shape[0] * BLOCK, -1).any(dim=1)  # [num_slots]
        changed = set(slots_changed.nonzero().flatten().tolist())
        assert changed - set(live_slots) <= pad_slots, "a pad row wrote outside the pad block"
        assert set(live_slots) <= changed
    # The live rows' logits are what the eager step computes for the same three sequences.
    assert logits[0].shape == logits[1].shape == (3, engine.vocab_size)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    for llm in (compiled, eager):
        llm.engine.abort_all()


def test_compiled_greedy_answers_equal_eager_ones_at_every_batch_size(pair):
    compiled, eager = pair
    for count in (1, 2, 3, 7, 9, 17):
        prompts = [random_tokens(4 + 3 * i, seed=100 + i) for i in range(count)]
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)
        outs = [llm.generate(prompts, params) for llm in (compiled, eager)]
        for a, b in zip(*outs):
            assert a.token_ids == b.token_ids
            for x, y in zip(a.events, b.events):
                assert abs(x.logprob - y.logprob) <= 1e-3


def test_one_graph_serves_every_bucket(tiny_dir):
    from torch._dynamo.utils import counters

    llm = make_llm(tiny_dir, "on")  # warm-up compiled the graph (on the smallest bucket)
    compiled_frames = counters["frames"]["ok"]
    for count in (1, 3, 5, 9, 17, 25, 32):
        llm.generate([random_tokens(6, seed=i) for i in range(count)], SamplingParams(max_tokens=3, temperature=0.0))
    assert counters["frames"]["ok"] == compiled_frames, "a decode bucket recompiled after warm-up"


def test_auto_stays_eager_and_says_why():
    cpu, kernel = torch.device("cpu"), object()
    compiled, why = resolve_compile("auto", cpu, True, kernel)
    assert not compiled and "compile = on for long-running servers" in why
    on_cuda, why = resolve_compile("auto", torch.device("cuda"), False, None)
    assert not on_cuda and "not measured on cuda" in why
    assert resolve_compile("on", torch.device("cuda"), False, None) == (True, "compile = on")
    assert resolve_compile("off", cpu, True, kernel) == (False, "compile = off")
    with pytest.raises(ValueError, match="compile must be one of auto, on, off"):
        CloudEngineConfig(compile="yes")


@pytest.mark.slow
def test_real_model_greedy_answers_are_identical_compiled_and_eager_in_float32():
    """The embedded 135M model in float32: the same greedy tokens, logprobs within 1e-3, for a batch
    of prompts decoding together (bucket padding included)."""
    prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Three reasons to learn a second language:",
        "Water boils at",
        "Once upon a time, in a small village,",
    ]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1)
    outs = []
    for mode in ("on", "off"):
        llm = LLM(None, dtype="float32", compile=mode, max_num_seqs=8, kv_cache_gb=0.1, max_model_len=256)
        outs.append(llm.generate(prompts, params))
    for compiled, eager in zip(*outs):
        assert compiled.token_ids == eager.token_ids, (compiled.text, eager.text)
        assert max(abs(a.logprob - b.logprob) for a, b in zip(compiled.events, eager.events)) <= 1e-3
