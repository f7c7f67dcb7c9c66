"""oneDNN-packed linear layers (bf16 on CPU) give the same numbers as the plain model, and a
server's varying step sizes do not grow oneDNN's per-shape caches without bound."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from cloud_engine.model.config import ModelConfig
from cloud_engine.model.llama import LlamaForCausalLM
from cloud_engine.model import packed_linear
from cloud_engine.model.packed_linear import (
    PackedLinear,
    can_pack,
    packing_supported,
    row_bucket,
    row_buckets,
    warm_up_packed_linears,
)
from tests.cloud_engine.heap_probe import heap_growth, needs_glibc
from tests.cloud_engine.paged_helpers import PagedBatchBuilder, make_kv_caches
from tests.cloud_engine.tiny_models import llama_config, random_tokens

# Decided by the CPU (torch's check of what oneDNN's bf16 path needs), never by what packing
# computes: a packed layer that disagrees with F.linear fails these tests.
needs_bf16_packing = pytest.mark.skipif(
    not packing_supported(torch.device("cpu"), torch.bfloat16),
    reason="this CPU lacks what oneDNN's bf16 path needs (AVX-512 BW/VL/DQ or AVX-NE-CONVERT): nothing to pack",
)


@needs_bf16_packing
@pytest.mark.parametrize("rows", [1, 2, 16, 17, 31, 32, 100, 513])  # padded: 17, 31, 100, 513
def test_packed_linear_equals_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen).bfloat16()
    bias = torch.randn(96, generator=gen).bfloat16()
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    # docs/cloud-engine.md's claim is "bit-identical": the same oneDNN kernel on prepacked weights, so equal, not close.
    assert torch.equal(PackedLinear(weight, bias)(x), F.linear(x, weight, bias))
    assert torch.equal(PackedLinear(weight, None)(x), F.linear(x, weight))


def test_only_bf16_on_cpu_is_packed():
    assert not can_pack(torch.device("cpu"), torch.float32)
    assert not can_pack(torch.device("cuda"), torch.bfloat16)
    # Where the CPU supports packing, the probe must agree: a disagreeing build is a failure here.
    assert can_pack(torch.device("cpu"), torch.bfloat16) == packing_supported(torch.device("cpu"), torch.bfloat16)


@needs_bf16_packing
def test_packed_model_gives_the_logits_of_the_plain_model():
    torch.manual_seed(0)
    model_config = ModelConfig.from_hf_config(llama_config().to_dict())
    plain = LlamaForCausalLM(model_config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for param in plain.parameters():
            param.copy_(torch.randn_like(param) * 0.1 + (1 if param.dim() == 1 else 0))
    packed = LlamaForCausalLM(model_config).to(torch.bfloat16).eval()
    packed.load_state_dict(plain.state_dict())
    assert packed.pack_for_cpu() == 3 * 4 + 1  # four linears per layer, plus the LM head
    logits = []
    for model in (plain, packed):
        model.bind_kv_caches(make_kv_caches(model_config, 16, 4, dtype=torch.bfloat16))
        builder = PagedBatchBuilder(16, 4, seed=2)
        builder.add_sequence("a", random_tokens(9, seed=5))
        batch = builder.step({"a": 9})
        with torch.inference_mode():
            logits.append(model.compute_logits(model(batch.input_ids, batch.positions, batch.metadata)))
    assert torch.equal(logits[1], logits[0])


def test_row_buckets_are_exact_for_decode_sizes_and_pad_under_an_eighth():
    assert [row_bucket(rows) for rows in range(1, 17)] == list(range(1, 17))
    buckets = []
    for rows in range(1, 5000):
        bucket = row_bucket(rows)
        assert rows <= bucket < rows * 1.125
        assert row_bucket(bucket) == bucket  # a bucket is its own bucket: padding is idempotent
        buckets.append(bucket)
    assert buckets == sorted(buckets)
    assert row_buckets(512) == sorted(set(buckets[:512]))
    assert len(row_buckets(512)) == 56  # what bounds oneDNN's cache per weight shape at the default budget


def _run_linears(linears, row_counts) -> None:
    with torch.inference_mode():
        for rows in row_counts:
            for linear in linears:
                linear(torch.zeros(rows, linear.in_features, dtype=torch.bfloat16))


@needs_glibc
@needs_bf16_packing
def test_after_warm_up_any_step_size_leaves_the_heap_flat(monkeypatch):
    """The soak's finding: one oneDNN primitive (with its scratch memory) per row count seen.
    With buckets built at load, 300 random step sizes add nothing; without, they add megabytes."""
    gen = torch.Generator().manual_seed(0)
    shapes = ((96, 64), (64, 96), (160, 64))
    rng = random.Random(0)
    sizes = [rng.randint(1, 512) for _ in range(300)]
    fresh = [PackedLinear(torch.randn(n, k, generator=gen).bfloat16(), None) for n, k in shapes]
    with monkeypatch.context() as patch:
        patch.setattr(packed_linear, "row_bucket", lambda rows: rows)  # the old behaviour: every size its own shape
        control = heap_growth(
            lambda: _run_linears(fresh, [s + 1000 for s in sizes[:100]])
        )  # row counts no other test has used
    # The control only explains a failure: where oneDNN keeps little per shape, the bound still holds.
    linears = [PackedLinear(torch.randn(n + 8, k, generator=gen).bfloat16(), None) for n, k in shapes]
    assert warm_up_packed_linears(linears + linears[:1], 512) == len(shapes) * len(row_buckets(512))
    growth = heap_growth(lambda: _run_linears(linears, sizes))
    assert growth < 2 << 20, f"heap grew {growth >> 10} KiB after warm-up (without buckets: {control >> 10} KiB)"
