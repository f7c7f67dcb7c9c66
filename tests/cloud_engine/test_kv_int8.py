"""The cloud engine's KV cache in int8 ([cloud] kv_cache_dtype = int8, cloud_engine.kv_quant).

The quantized rows must dequantize to within half a step of what was written; the CPU decode kernel
reading them in place must equal dequantize-then-attend (float64, the same rows); and the engine's books
must work as in float32: a prompt, its chunks, a prefix-cache hit and a recompute after preemption all
attend to the same stored values, so they give the same greedy tokens, and compiled steps give what eager
steps give. What int8 costs in answers against bf16 is bench.kv_precision's measurement.
"""

from __future__ import annotations

import pytest
import torch

from cloud_engine.attention import write_kv_cache
from cloud_engine.config import CloudEngineConfig
from cloud_engine.kv_cache import bytes_per_block
from cloud_engine.kv_quant import SCALE_BYTES, dequantize_rows, quantize_rows, resolve_kv_cache_dtype
from cloud_engine.llm import LLM
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.kernel_helpers import built_cpu_kernels
from tests.cloud_engine.test_cpu_attention import context_of, dense_attention, random_paged_batch
from tests.cloud_engine.tiny_models import gemma3_config, random_tokens, save_tiny_llama

BLOCK = 4


def test_rows_dequantize_within_half_a_step():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 64, generator=gen) * torch.logspace(-4, 3, 50)[:, None, None]  # tiny to large rows
    x[7] = 0.0  # an all-zero row keeps a finite scale and comes back as zeros
    rows = quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 3, 64 + SCALE_BYTES)
    back = dequantize_rows(rows, torch.float32)
    scale = rows[..., 64:].contiguous().view(torch.float16).float()
    assert torch.all((back - x).abs() <= scale * 0.5 + 1e-6 * x.abs())
    assert torch.equal(back[7], torch.zeros_like(back[7]))
    assert rows[..., :64].abs().max() <= 127


def test_write_stores_quantized_rows_at_the_slots():
    cache = torch.zeros(6, BLOCK, 2, 16 + SCALE_BYTES, dtype=torch.int8)
    other = torch.zeros_like(cache)
    key = torch.randn(3, 2, 16)
    write_kv_cache(key, key * 2, cache, other, torch.tensor([1, 9, 22]))
    flat = cache.view(-1, 2, 16 + SCALE_BYTES)
    assert torch.equal(flat[[1, 9, 22]], quantize_rows(key))
    assert flat.count_nonzero(dim=(1, 2)).nonzero().flatten().tolist() == [1, 9, 22]


def test_settings_the_cache_cannot_honour_are_refused_by_name():
    with pytest.raises(ValueError, match="kv_cache_dtype.*fp8_e4m3.*int8"):
        CloudEngineConfig(kv_cache_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match="kv_cache_dtype 'bfloat16' with the engine's dtype float32"):
        resolve_kv_cache_dtype("bfloat16", torch.float32)
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("int8", torch.float32) == torch.int8


def test_an_int8_block_holds_its_scales_and_fits_1_9x_the_tokens_of_bf16():
    bf16 = bytes_per_block(30, 16, 3, 64, torch.bfloat16)
    int8 = bytes_per_block(30, 16, 3, 64, torch.int8)
    assert int8 == 2 * 30 * 16 * 3 * (64 + 2)  # every row's 64 values and its 2-byte scale
    assert bf16 / int8 >= 1.9


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (4, 4, 128), (8, 2, 32)])
def test_decode_kernel_on_int8_rows_equals_dequantize_then_attend(num_heads, num_kv_heads, head_dim, window):
    kernels = built_cpu_kernels()
    lengths = [1, 5, 16, 17, 40, 100]
    query, key_cache, value_cache, tables, lens = random_paged_batch(
        len(lengths), lengths, num_heads, num_kv_heads, head_dim, 16, torch.float32, seed=head_dim + window
    )
    key_rows, value_rows = quantize_rows(key_cache * 3), quantize_rows(value_cache)
    scale = head_dim**-0.5
    out = kernels.paged_decode_attention(query, key_rows, value_rows, tables, lens, scale, window)
    assert out.dtype == torch.float32 and out.shape == query.shape
    keys_back, values_back = dequantize_rows(key_rows, torch.float64), dequantize_rows(value_rows, torch.float64)
    for seq, length in enumerate(lengths):
        expected = dense_attention(
            query[seq : seq + 1],
            context_of(keys_back, tables[seq], length),
            context_of(values_back, tables[seq], length),
            scale,
            query_offset=length - 1,
            window=window,
        )[0]
        torch.testing.assert_close(out[seq].double(), expected, atol=1e-5, rtol=1e-5)


# -- the engine on int8 caches ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-int8"))


@pytest.fixture(scope="module")
def tiny_gemma_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-gemma3-int8"), gemma3_config())


def make_llm(model_dir, **overrides) -> LLM:
    config = dict(
        dtype="float32",
        kv_cache_dtype="int8",
        block_size=BLOCK,
        kv_cache_gb=0.002,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=96,
    )
    config.update(overrides)
    return LLM(model_dir, **config)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def tokens(llm: LLM, prompts, n: int = 16) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(prompts, greedy(n))]


PROMPTS = [random_tokens(n, seed=n) for n in (3, 11, 26, 41)]


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_int8_engine_answers_alike_whatever_the_batch_chunks_backend_or_compile(model, tiny_dir, tiny_gemma_dir):
    """Batched against alone, chunked against whole prompts, the CPU kernel against the portable path, compiled
    against eager: the same stored rows, so the same greedy tokens (Gemma 3's sliding window included)."""
    model_dir = tiny_dir if model == "llama" else tiny_gemma_dir
    reference = make_llm(model_dir, attention_backend="torch", compile="off", max_num_batched_tokens=256)
    expected = [tokens(reference, [prompt])[0] for prompt in PROMPTS]  # alone, whole prompts, portable path
    assert reference.engine.kv_dtype == torch.int8 and reference.engine.stats().kv_cache_dtype == "int8"
    for overrides in (
        dict(),  # batched, CPU kernel where it builds, eager
        dict(max_num_batched_tokens=8, max_num_seqs=4),  # prompts in chunks of a few tokens
        dict(compile="on"),
    ):
        assert tokens(make_llm(model_dir, **overrides), PROMPTS) == expected, overrides


def test_a_prefix_cache_hit_answers_as_the_miss_did(tiny_dir):
    llm = make_llm(tiny_dir)
    prefix = random_tokens(24, seed=77)  # six full blocks
    first = tokens(llm, [prefix + PROMPTS[1]])[0]
    hits = llm.engine.kv_manager.num_prefix_cache_hits_total
    assert tokens(llm, [prefix + PROMPTS[1]])[0] == first
    assert llm.engine.kv_manager.num_prefix_cache_hits_total - hits >= 24


def test_preemption_recomputes_the_same_tokens_and_frees_every_block(tiny_dir):
    roomy = make_llm(tiny_dir, kv_cache_gb=0.01, max_model_len=40)
    tight = make_llm(tiny_dir, kv_cache_gb=0.000025, max_model_len=40)  # 31 blocks for 36 wanted: must preempt
    prompts = [random_tokens(12, seed=10 + i) for i in range(4)]
    expected = tokens(roomy, prompts, 24)
    assert tokens(tight, prompts, 24) == expected
    assert tight.engine.scheduler.num_preemptions_total > 0
    assert tight.engine.kv_manager.num_used_blocks == 0


def test_stats_count_the_int8_pool_and_its_scales(tiny_dir):
    int8, f32 = make_llm(tiny_dir), make_llm(tiny_dir, kv_cache_dtype="auto")
    stats, base = int8.engine.stats(), f32.engine.stats()
    assert stats.kv_cache_dtype == "int8" and base.kv_cache_dtype == "float32"
    # tiny Llama: head_dim 16, so a row is 18 bytes against float32's 64
    assert stats.kv_tokens_per_gib / base.kv_tokens_per_gib == pytest.approx(64 / 18, rel=0.01)
    assert stats.kv_cache_bytes_total <= 0.002 * 2**30


async def test_health_and_metrics_report_the_int8_pool(tiny_dir):
    import asyncio

    import httpx

    from cloud_engine.async_engine import AsyncCloudEngine
    from tests.app_helpers import make_app

    config = CloudEngineConfig(
        model=tiny_dir, model_name="tiny", block_size=BLOCK, kv_cache_gb=0.001, max_model_len=64, kv_cache_dtype="int8"
    )
    engine = AsyncCloudEngine(config).start()
    try:
        await asyncio.to_thread(engine.wait_ready, 60)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(engine)), base_url="http://t") as http:
            health = (await http.get("/health")).json()
            metrics = (await http.get("/metrics")).text
    finally:
        engine.shutdown()
    # tiny Llama: 3 layers x 2 (K, V) x 2 heads x (16 values + 2 scale bytes) = 216 bytes a token
    assert health["kv_cache"]["dtype"] == "int8"
    assert health["kv_cache"]["tokens_per_gib"] == round(2**30 / 216)
    assert f"tandem:kv_cache_tokens {float(health['kv_cache']['tokens'])}" in metrics


def test_a_draft_model_keeps_its_cache_in_int8_and_greedy_output_unchanged(tiny_dir):
    """The draft's pool has the target's block count, which int8 sized: it is int8 too (in the model's dtype it
    would take 3.6x the budget here), and speculation keeps the greedy tokens of the int8 engine without it."""
    from cloud_engine.spec_decode import SpeculativeConfig

    spec = SpeculativeConfig(method="draft", draft_model=tiny_dir, num_speculative_tokens=3)
    llm = make_llm(tiny_dir, speculative=spec)
    proposer = llm.engine.speculator.proposer
    draft_cache = proposer.runner.model.model.layers[0].self_attn.kv_cache[0]
    assert draft_cache.dtype == torch.int8 and draft_cache.shape[0] >= llm.engine.num_blocks
    assert tokens(llm, PROMPTS) == tokens(make_llm(tiny_dir), PROMPTS)
    assert llm.engine.speculator.stats.num_drafts > 0
    assert llm.engine.kv_manager.num_used_blocks == 0 and proposer.num_used_blocks == 0
