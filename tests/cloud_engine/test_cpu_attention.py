"""The CPU attention paths against a float64 dense reference.

The decode kernel (cloud_engine/kernels) reads K/V straight from block caches; the tiled
prefill path replaces SDPA on CPU. Both must equal plain softmax(q k^T * scale) v over each
sequence's own context, for any block table, length, head size and GQA group.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cloud_engine.attention import (
    CPU_TILE_ROWS,
    PrefillChunk,
    causal_attention_sdpa,
    causal_attention_tiled,
    decode_attention_portable,
    sliding_window_mask,
)
from cloud_engine.kernels import select_decode_kernel
from tests.cloud_engine.heap_probe import heap_growth, needs_glibc
from tests.cloud_engine.kernel_helpers import built_cpu_kernels


@pytest.fixture(scope="module")
def kernels():
    return built_cpu_kernels()


def dense_attention(query, keys, values, scale, query_offset=0, window=0):
    """float64 causal reference: query [q, H, D], keys/values [ctx, Hkv, D]; with a window, each query
    sees only its last `window` positions."""
    group = query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, ctx, D]
    v = values.double().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.einsum("qhd,hkd->hqk", query.double(), k) * scale
    positions = torch.arange(query.shape[0])[:, None] + query_offset
    key_positions = torch.arange(keys.shape[0])[None, :]
    hidden = (key_positions > positions) | ((key_positions <= positions - window) if window else False)
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,hkd->qhd", torch.softmax(scores, dim=-1), v)


def random_paged_batch(num_seqs, lengths, num_heads, num_kv_heads, head_dim, block_size, dtype, seed):
    """Caches filled with noise, shuffled block tables; returns what the kernel takes plus per-sequence K/V."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in lengths]
    max_blocks = max(blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 5
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(num_seqs, max_blocks, dtype=torch.int64)
    for seq, count in enumerate(blocks_per_seq):
        tables[seq, :count] = torch.tensor([order.pop() for _ in range(count)])
    query = torch.randn(num_seqs, num_heads, head_dim, generator=gen).to(dtype)
    return query, key_cache, value_cache, tables, torch.tensor(lengths, dtype=torch.int64)


def context_of(cache, table, length):
    return cache[table].reshape(-1, *cache.shape[2:])[:length]


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim",
    [(9, 3, 64), (4, 4, 128), (8, 2, 32), (4, 1, 16)],
    ids=["gqa3-d64", "mha-d128", "gqa4-d32", "mqa-d16"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_matches_dense_reference(kernels, num_heads, num_kv_heads, head_dim, dtype):
    lengths = [1, 5, 16, 17, 40, 100]  # a lone token, part of a block, exactly one, one past, several
    query, key_cache, value_cache, tables, lens = random_paged_batch(
        len(lengths), lengths, num_heads, num_kv_heads, head_dim, block_size=16, dtype=dtype, seed=head_dim
    )
    scale = head_dim**-0.5
    out = kernels.paged_decode_attention(query, key_cache, value_cache, tables, lens, scale)
    assert out.dtype == dtype and out.shape == query.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for seq, length in enumerate(lengths):
        keys = context_of(key_cache, tables[seq], length)
        values = context_of(value_cache, tables[seq], length)
        expected = dense_attention(query[seq : seq + 1], keys, values, scale, query_offset=length - 1)[0]
        torch.testing.assert_close(out[seq].double(), expected, atol=tolerance, rtol=tolerance)


def test_decode_kernel_handles_peaked_softmax(kernels):
    """Large score gaps (exp underflow for all but one key) must not give NaN or drift."""
    query, key_cache, value_cache, tables, lens = random_paged_batch(2, [33, 7], 2, 1, 64, 4, torch.float32, seed=3)
    query = query * 40
    out = kernels.paged_decode_attention(query, key_cache, value_cache, tables, lens, 1.0)
    for seq, length in enumerate([33, 7]):
        expected = dense_attention(
            query[seq : seq + 1],
            context_of(key_cache, tables[seq], length),
            context_of(value_cache, tables[seq], length),
            1.0,
            length - 1,
        )[0]
        torch.testing.assert_close(out[seq].double(), expected, atol=1e-4, rtol=1e-4)


def test_decode_kernel_refuses_tables_outside_the_cache(kernels):
    query, key_cache, value_cache, tables, lens = random_paged_batch(2, [10, 20], 4, 2, 16, 16, torch.float32, seed=1)
    bad = tables.clone()
    bad[1, 1] = key_cache.shape[0]  # one past the last block
    with pytest.raises(RuntimeError, match="block id outside the cache"):
        kernels.paged_decode_attention(query, key_cache, value_cache, bad, lens, 0.25)
    with pytest.raises(RuntimeError, match="outside its block table"):
        kernels.paged_decode_attention(query, key_cache, value_cache, tables, torch.tensor([10, 33]), 0.25)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or int8"):
        kernels.paged_decode_attention(query.half(), key_cache.half(), value_cache.half(), tables, lens, 0.25)


@pytest.mark.parametrize("query_len,query_offset", [(1, 0), (7, 0), (CPU_TILE_ROWS, 0), (150, 0), (20, 35), (130, 77)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_prefill_matches_dense_reference(query_len, query_offset, dtype):
    """Chunks shorter, equal to and longer than a tile, alone and after a cached context."""
    gen = torch.Generator().manual_seed(query_len + query_offset)
    context = query_offset + query_len
    query = torch.randn(query_len, 6, 32, generator=gen).to(dtype)
    keys = torch.randn(context, 2, 32, generator=gen).to(dtype)
    values = torch.randn(context, 2, 32, generator=gen).to(dtype)
    out = causal_attention_tiled(query, keys, values, query_offset, 32**-0.5)
    assert out.dtype == dtype and out.shape == query.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        out.double(), dense_attention(query, keys, values, 32**-0.5, query_offset), atol=tolerance, rtol=tolerance
    )


def _random_prefill_shapes(count, seed):
    rng = random.Random(seed)
    for _ in range(count):
        query_len = rng.randint(1, 2 * CPU_TILE_ROWS)
        yield query_len, rng.randint(0, 600)


def _bf16_bmm(shapes) -> None:
    """The old tile product, bf16 probabilities x bf16 values, over the given shapes."""
    for query_len, query_offset in shapes:
        rows, visible = min(query_len, CPU_TILE_ROWS), query_offset + query_len
        torch.bmm(torch.rand(2, 3 * rows, visible).bfloat16(), torch.rand(2, visible, 32).bfloat16())


@needs_glibc
def test_tiled_prefill_in_bf16_keeps_no_state_per_shape():
    """The soak's second finding: oneDNN caches a primitive with scratch memory per bf16 bmm
    shape, and prefill chunks come in thousands of (rows, visible) shapes. The tiled path must
    leave the heap flat over shapes it has never seen."""
    control = heap_growth(lambda: _bf16_bmm(_random_prefill_shapes(100, seed=1)))
    # The control only explains a failure: where oneDNN keeps little per shape (a CPU without its
    # bf16 path), the bound still holds.
    gen = torch.Generator().manual_seed(0)

    def run(shapes):
        for query_len, query_offset in shapes:
            context = query_offset + query_len
            causal_attention_tiled(
                torch.randn(query_len, 6, 32, generator=gen).bfloat16(),
                torch.randn(context, 2, 32, generator=gen).bfloat16(),
                torch.randn(context, 2, 32, generator=gen).bfloat16(),
                query_offset,
                32**-0.5,
            )

    run(_random_prefill_shapes(5, seed=2))  # BLAS sets up its per-thread buffers once
    growth = heap_growth(lambda: run(_random_prefill_shapes(200, seed=3)))
    assert growth < 2 << 20, f"heap grew {growth >> 10} KiB over 200 shapes (bf16 bmm: {control >> 10} KiB over 100)"


@pytest.mark.parametrize("query_len,query_offset", [(9, 0), (20, 35)])
def test_sdpa_prefill_matches_dense_reference(query_len, query_offset):
    """The GPU prefill path, checked here on CPU: plain causal, and a chunk after cached context (explicit mask)."""
    gen = torch.Generator().manual_seed(7 + query_offset)
    context = query_offset + query_len
    query = torch.randn(query_len, 6, 32, generator=gen)
    keys, values = torch.randn(context, 2, 32, generator=gen), torch.randn(context, 2, 32, generator=gen)
    mask = None
    if query_offset:
        mask = torch.arange(context)[None, :] <= torch.arange(query_offset, context)[:, None]
    out = causal_attention_sdpa(query, keys, values, mask, 32**-0.5)
    torch.testing.assert_close(
        out.double(), dense_attention(query, keys, values, 32**-0.5, query_offset), atol=1e-5, rtol=1e-5
    )


def test_backend_selection():
    cpu = torch.device("cpu")
    assert select_decode_kernel("torch", cpu, torch.float32, 9, 3, 64) is None
    assert select_decode_kernel("auto", cpu, torch.float16, 9, 3, 64) is None  # fp16 caches: portable path
    assert select_decode_kernel("auto", cpu, torch.float32, 4, 2, 8) is None  # head_dim 8: portable path
    with pytest.raises(ValueError, match="CPU only"):
        select_decode_kernel("cpu-kernel", torch.device("cuda"), torch.bfloat16, 9, 3, 64)
    with pytest.raises(ValueError, match="head_dim 8"):
        select_decode_kernel("cpu-kernel", cpu, torch.float32, 4, 2, 8)
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        select_decode_kernel("flash", cpu, torch.float32, 9, 3, 64)


# Windows shorter than a block, spanning blocks, starting mid-block, and as long as or longer than a context.
WINDOWS = [3, 16, 21, 100, 500]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_decode_matches_dense_reference(kernels, window, dtype):
    """Gemma 3's local layers: the kernel and the portable path see each sequence's last `window` tokens only."""
    lengths = [1, 5, 16, 17, 40, 100]
    query, key_cache, value_cache, tables, lens = random_paged_batch(
        len(lengths), lengths, 8, 2, 32, block_size=16, dtype=dtype, seed=window
    )
    scale = 32**-0.5
    kernel_out = kernels.paged_decode_attention(query, key_cache, value_cache, tables, lens, scale, window)
    portable_out = decode_attention_portable(query, key_cache, value_cache, tables, lens, scale, window)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for seq, length in enumerate(lengths):
        keys, values = context_of(key_cache, tables[seq], length), context_of(value_cache, tables[seq], length)
        expected = dense_attention(query[seq : seq + 1], keys, values, scale, length - 1, window)[0]
        for out in (kernel_out, portable_out):
            torch.testing.assert_close(out[seq].double(), expected, atol=tolerance, rtol=tolerance)


def test_sliding_window_decode_reads_no_block_before_the_window(kernels):
    """Blocks wholly before a sequence's window are not read: poisoned with NaN, the answer stays finite."""
    query, key_cache, value_cache, tables, lens = random_paged_batch(1, [70], 4, 1, 16, 16, torch.float32, seed=3)
    for block in tables[0, :3].tolist():  # positions 0..47; a window of 20 at length 70 starts at 50
        key_cache[block] = float("nan")
        value_cache[block] = float("nan")
    assert kernels.paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.25, 20).isfinite().all()
    assert kernels.paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.25).isnan().any()


@pytest.mark.parametrize("query_len,query_offset", [(7, 0), (150, 0), (20, 35), (130, 77)])
@pytest.mark.parametrize("window", [5, 64, 100])
def test_sliding_window_prefill_matches_dense_reference(query_len, query_offset, window):
    """The tiled CPU path and the SDPA path with a window, from the start of the context and after cached keys."""
    gen = torch.Generator().manual_seed(query_len + window)
    context = query_offset + query_len
    query = torch.randn(query_len, 6, 32, generator=gen)
    keys, values = torch.randn(context, 2, 32, generator=gen), torch.randn(context, 2, 32, generator=gen)
    expected = dense_attention(query, keys, values, 32**-0.5, query_offset, window)
    tiled = causal_attention_tiled(query, keys, values, query_offset, 32**-0.5, window)
    mask = sliding_window_mask(query_offset, query_len, context, window, query.device)
    sdpa = causal_attention_sdpa(query, keys, values, mask, 32**-0.5)
    for out in (tiled, sdpa):
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    # The tiled path given only the keys from a block boundary on (what the paged path gathers) agrees.
    first = max(0, query_offset - window + 1) // 16 * 16
    offset_out = causal_attention_tiled(query, keys[first:], values[first:], query_offset, 32**-0.5, window, first)
    torch.testing.assert_close(offset_out.double(), expected, atol=1e-5, rtol=1e-5)


def test_a_prefill_chunk_builds_each_windowed_mask_once():
    """The SDPA path's masks: the plain one is the causal mask offset by the cached context, and a window's is
    built on the first layer that asks and shared by the others."""
    cpu = torch.device("cpu")
    causal = sliding_window_mask(7, 5, 12, 0, cpu)
    assert torch.equal(causal, torch.arange(12)[None, :] <= torch.arange(7, 12)[:, None])
    chunk = PrefillChunk(0, 5, 12, torch.arange(3), causal)
    assert chunk.query_offset == 7 and chunk.mask_for(0, cpu) is causal
    windowed = chunk.mask_for(4, cpu)
    assert torch.equal(windowed, sliding_window_mask(7, 5, 12, 4, cpu)) and chunk.mask_for(4, cpu) is windowed
    assert windowed.sum(dim=1).tolist() == [4] * 5  # every query sees exactly its window
