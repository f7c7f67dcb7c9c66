"""Portable paged attention: store new K/V in the block caches, attend through block tables.

Pure PyTorch (one `scaled_dot_product_attention` for the whole decode group, one per
prefill chunk), so it runs on CPU and any GPU. A fused CUDA kernel can replace
`paged_attention` later behind the same signature and the same cache layout:
key_cache / value_cache [num_blocks, block_size, num_kv_heads, head_dim].

Index tensors and masks depend only on the batch layout, so they are built once per
step (`plan_paged_attention`) and cached on the AttentionMetadata for every layer.

A sliding-window layer (`window` > 0: Gemma 3's local layers) lets each query see only the last
`window` positions up to its own, as transformers does. The CPU decode kernel and the CPU prefill
path read only those positions' blocks; the portable decode path gathers the whole table and masks.

When the metadata carries a native decode kernel (cloud_engine/kernels, on CPU), the
decode group reads the block caches in place instead of gathering them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cloud_engine.attention_metadata import AttentionMetadata, DecodeMetadata
from cloud_engine.kv_quant import as_cache_rows, is_quantized, read_cache_rows

_PLAN_KEY = "paged_attention_plan"


@dataclass
class PrefillChunk:
    """One sequence's chunk of query tokens and where its context lives."""

    query_start: int  # first token of the chunk in the flattened batch
    query_end: int  # one past its last token
    context_len: int  # cached + new tokens of the sequence after this step
    block_ids: torch.Tensor | None  # [num_context_blocks] blocks to gather; None when the chunk is its whole context
    mask: torch.Tensor | None  # bool [query_len, context_len] causal mask offset by the cached context
    windowed_masks: dict[int, torch.Tensor] = field(default_factory=dict)  # by window, built on first use

    @property
    def query_offset(self) -> int:
        """Position of the chunk's first query token."""
        return self.context_len - (self.query_end - self.query_start)

    def mask_for(self, window: int, device: torch.device) -> torch.Tensor | None:
        """The SDPA mask of a layer with this sliding window (0: the chunk's causal mask, None when plain
        causal); built once per step for every layer of that window."""
        if not window:
            return self.mask
        mask = self.windowed_masks.get(window)
        if mask is None:
            query_len = self.query_end - self.query_start
            mask = sliding_window_mask(self.query_offset, query_len, self.context_len, window, device)
            self.windowed_masks[window] = mask
        return mask


@dataclass
class PagedAttentionPlan:
    """Per-step gather indices and masks shared by every layer."""

    num_decodes: int
    decode_block_ids: torch.Tensor | None  # [num_decodes * num_decode_blocks] flattened block tables
    num_decode_blocks: int  # blocks gathered per decode sequence (enough for the longest)
    decode_mask: torch.Tensor | None  # bool [num_decodes, 1, 1, num_decode_blocks * block_size]: key is in context
    decode_block_tables: torch.Tensor | None  # [num_decodes, num_decode_blocks] for a native kernel
    decode_seq_lens: torch.Tensor | None  # [num_decodes]
    prefills: list[PrefillChunk]
    windowed_decode_masks: dict[int, torch.Tensor] = field(default_factory=dict)  # by window, built on first use

    def decode_mask_for(self, window: int) -> torch.Tensor | None:
        """The portable decode mask of a layer with this sliding window (0: the whole context)."""
        if not window or self.decode_mask is None:
            return self.decode_mask
        mask = self.windowed_decode_masks.get(window)
        if mask is None:
            mask = self.windowed_decode_masks[window] = _window_decode_mask(
                self.decode_mask, self.decode_seq_lens, window
            )
        return mask


def _window_decode_mask(mask: torch.Tensor, seq_lens: torch.Tensor, window: int) -> torch.Tensor:
    """`mask` [seqs, 1, 1, keys] with the keys before each sequence's last `window` hidden too."""
    key_positions = torch.arange(mask.shape[-1], device=mask.device)
    return mask & (key_positions[None, :] >= seq_lens[:, None] - window)[:, None, None, :]


def decode_plan(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int, block_size: int, gather: bool
) -> PagedAttentionPlan:
    """The decode group's plan (no prefills): one row of `block_tables` and `seq_lens` per decoding
    sequence, as many blocks each as `max_len` needs; gather indices and the mask only when `gather`
    (the portable path; a native kernel reads the tables in place)."""
    num_blocks = -(-max_len // block_size)
    tables = block_tables[:, :num_blocks].contiguous()
    block_ids = mask = None
    if gather:
        block_ids = tables.reshape(-1)
        key_positions = torch.arange(num_blocks * block_size, device=block_tables.device)
        mask = (key_positions[None, :] < seq_lens[:, None])[:, None, None, :]
    return PagedAttentionPlan(len(tables), block_ids, num_blocks, mask, tables, seq_lens, [])


def plan_paged_attention(metadata: AttentionMetadata) -> PagedAttentionPlan:
    """Build (or fetch the cached) gather plan for this step's batch; no device sync."""
    cached = metadata.derived.get(_PLAN_KEY)
    if cached is not None:
        return cached
    block_size, num_decodes = metadata.block_size, metadata.num_decodes
    block_tables, device = metadata.block_tables, metadata.block_tables.device
    if num_decodes:
        plan = decode_plan(
            block_tables[:num_decodes],
            metadata.seq_lens[:num_decodes],
            max(metadata.seq_lens_list[:num_decodes]),
            block_size,
            gather=metadata.decode_kernel is None,  # only the portable path gathers and masks
        )
    else:
        plan = PagedAttentionPlan(0, None, 0, None, None, None, [])
    prefills = []
    qsl = metadata.query_start_loc
    for seq in range(num_decodes, metadata.num_seqs):
        start, end, context_len = qsl[seq], qsl[seq + 1], metadata.seq_lens_list[seq]
        query_len = end - start
        if query_len > context_len:
            raise ValueError(f"sequence {seq} has {query_len} new tokens but a context of only {context_len}")
        if query_len == context_len:  # nothing cached before: attend to the new K/V directly
            prefills.append(PrefillChunk(start, end, context_len, None, None))
            continue
        block_ids = block_tables[seq, : -(-context_len // block_size)]
        # Query i (0-based in the chunk) sits at position context_len - query_len + i.
        mask = sliding_window_mask(context_len - query_len, query_len, context_len, 0, device)
        prefills.append(PrefillChunk(start, end, context_len, block_ids, mask))
    plan.prefills = prefills
    metadata.derived[_PLAN_KEY] = plan
    return plan


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value [num_tokens, num_kv_heads, head_dim] at flat slots block_id * block_size + offset
    (quantized first when the caches are int8: cloud_engine.kv_quant)."""
    num_kv_heads, row_width = key_cache.shape[-2:]
    key_cache.view(-1, num_kv_heads, row_width).index_copy_(0, slot_mapping, as_cache_rows(key, key_cache))
    value_cache.view(-1, num_kv_heads, row_width).index_copy_(0, slot_mapping, as_cache_rows(value, value_cache))


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """Write this step's K/V, then attend every query token to its sequence's context (its last `window`
    positions when window > 0).

    query [num_tokens, num_heads, head_dim]; key, value [num_tokens, num_kv_heads, head_dim];
    returns [num_tokens, num_heads, head_dim]. Query head h reads K/V head h // (num_heads // num_kv_heads).
    """
    if isinstance(metadata, DecodeMetadata):  # a compiled decode step: one op (cloud_engine.custom_ops)
        op = torch.ops.tandem_cpu.write_and_attend if metadata.native else torch.ops.tandem.paged_decode_attention
        return op(
            query,
            as_cache_rows(key, key_cache),  # quantized here for an int8 cache: the graph fuses it with rotary
            as_cache_rows(value, value_cache),
            key_cache,
            value_cache,
            metadata.slot_mapping,
            metadata.block_tables,
            metadata.seq_lens,
            scale,
            window,
        )
    write_kv_cache(key, value, key_cache, value_cache, metadata.slot_mapping)
    plan = plan_paged_attention(metadata)
    outputs = []
    if plan.num_decodes:
        decode_query = query[: plan.num_decodes]
        if metadata.decode_kernel is not None:
            outputs.append(
                metadata.decode_kernel(
                    decode_query, key_cache, value_cache, plan.decode_block_tables, plan.decode_seq_lens, scale, window
                )
            )
        else:
            outputs.append(_decode_attention(decode_query, key_cache, value_cache, plan, scale, window))
    for chunk in plan.prefills:
        outputs.append(_prefill_attention(query, key, value, key_cache, value_cache, chunk, scale, window))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)


def decode_attention_portable(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """The portable decode path from block tables and lengths alone (no plan): gathers as many
    blocks per sequence as the longest needs, so the tables may be wider than that."""
    plan = decode_plan(block_tables, seq_lens, int(seq_lens.max()), key_cache.shape[1], gather=True)
    return _decode_attention(query, key_cache, value_cache, plan, scale, window)


def _decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    plan: PagedAttentionPlan,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, row_width = key_cache.shape
    padded_len = plan.num_decode_blocks * block_size
    # [seqs, padded_len, kv_heads, dim] -> [seqs, kv_heads, padded_len, dim]
    keys, values = (
        read_cache_rows(
            cache.index_select(0, plan.decode_block_ids).view(num_seqs, padded_len, num_kv_heads, row_width),
            query.dtype,
        )
        for cache in (key_cache, value_cache)
    )
    # GQA without copying K/V: the query heads that share a K/V head become that head's query rows.
    grouped_query = query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        grouped_query, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=plan.decode_mask_for(window), scale=scale
    )
    return out.reshape(num_seqs, num_heads, head_dim)


def _prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    start, end, query_offset = chunk.query_start, chunk.query_end, chunk.query_offset
    num_kv_heads, row_width = key_cache.shape[-2:]
    # int8 rows read back in float32 where the tiled path computes in float32 anyway (CPU): the exact product of
    # value and scale, as the decode kernel uses, not that product rounded once more to bf16.
    read_dtype = torch.float32 if query.device.type == "cpu" else query.dtype
    key_offset = 0  # position of keys[0]
    if chunk.block_ids is None:
        keys, values = key[start:end], value[start:end]
        if is_quantized(key_cache):
            # As stored: a prompt then attends to the values its later chunks, a prefix-cache hit and a
            # recompute after preemption read back, so all of them give the same tokens.
            keys, values = (read_cache_rows(as_cache_rows(x, key_cache), read_dtype) for x in (keys, values))
    else:
        block_ids = chunk.block_ids
        if window and query.device.type == "cpu":
            # Blocks wholly before the first query's window are not read (the tiled path takes an offset).
            first_block = max(0, query_offset - window + 1) // key_cache.shape[1]
            block_ids, key_offset = block_ids[first_block:], first_block * key_cache.shape[1]
        visible = chunk.context_len - key_offset
        keys, values = (
            read_cache_rows(cache.index_select(0, block_ids).view(-1, num_kv_heads, row_width)[:visible], read_dtype)
            for cache in (key_cache, value_cache)
        )
    if query.device.type == "cpu":
        return causal_attention_tiled(query[start:end], keys, values, query_offset, scale, window, key_offset)
    return causal_attention_sdpa(query[start:end], keys, values, chunk.mask_for(window, query.device), scale)


def sliding_window_mask(
    query_offset: int, query_len: int, context_len: int, window: int, device: torch.device
) -> torch.Tensor:
    """bool [query_len, context_len]: query i (at query_offset + i) sees the keys up to its own position, only
    its last `window` of them when window > 0."""
    query_positions = torch.arange(query_offset, query_offset + query_len, device=device)[:, None]
    key_positions = torch.arange(context_len, device=device)[None, :]
    causal = key_positions <= query_positions
    return causal & (key_positions > query_positions - window) if window else causal


def causal_attention_sdpa(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """The portable prefill path (GPUs): one SDPA call; `mask` as in PrefillChunk (None: plain causal)."""
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1),  # [heads, query_len, dim]
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=query.shape[1] != keys.shape[1],
    )
    return out.transpose(0, 1)


# Query rows per tile of the CPU prefill path: small enough that a tile's float32 scores
# stay in cache (a 512-row tile measured 3x slower than 64-row tiles on a 2-core EPYC).
CPU_TILE_ROWS = 64


def causal_attention_tiled(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    query_offset: int,
    scale: float,
    window: int = 0,
    key_offset: int = 0,
) -> torch.Tensor:
    """Causal attention as tiled matmuls, for CPUs, where it measured 2-3x faster than SDPA.

    query [q, heads, dim]; keys, values [context, kv_heads, dim], keys[j] at position key_offset + j;
    query i sits at position query_offset + i and sees keys up to its own position (and, when
    window > 0, only its last `window` positions). Both matmuls run in float32 (BLAS); returns
    [q, heads, dim] in the query's dtype. A tile reads only the keys its rows can see.

    Why not bf16 probabilities x values, as flash attention does: on CPU that bmm goes through
    oneDNN, which builds and caches one primitive with its scratch memory (~0.5 MB) per
    (rows, visible) shape, and a server's prefill chunks have thousands of such shapes. The
    soak measured it as ~90 KB of heap per request that never came back. Float32 has no per-shape
    state; on a 2-core EPYC it measured up to 30% slower per attention call for long contexts,
    faster for short chunks; bench.chunked_prefill's whole 1500-2000-token prompts took ~10% longer.
    """
    query_len, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    keys_t = keys.permute(1, 2, 0).float()  # [kv_heads, dim, context]
    values_h = values.transpose(0, 1).float()  # [kv_heads, context, dim]
    out = torch.empty_like(query)
    hidden = torch.ones(CPU_TILE_ROWS, CPU_TILE_ROWS, dtype=torch.bool, device=query.device).triu_(1)
    for start in range(0, query_len, CPU_TILE_ROWS):
        end = min(query_len, start + CPU_TILE_ROWS)
        rows, last = end - start, query_offset + end - key_offset  # keys [first, last) of the array are read
        first = max(0, query_offset + start - window + 1 - key_offset) if window else 0
        # GQA without copying K/V: a K/V head's query heads become extra rows of its matmul.
        tile = query[start:end].float().view(rows, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        scores = torch.bmm(tile.reshape(num_kv_heads, group * rows, head_dim), keys_t[:, :, first:last])
        scores = scores.view(num_kv_heads, group, rows, last - first)
        if window:
            scores.masked_fill_(
                ~sliding_window_mask(
                    query_offset + start - key_offset - first, rows, last - first, window, query.device
                ),
                float("-inf"),
            )
        else:
            scores[..., last - rows :].masked_fill_(hidden[:rows, :rows], float("-inf"))  # the diagonal block
        probs = torch.softmax(scores.mul_(scale), dim=-1)
        tile_out = torch.bmm(probs.view(num_kv_heads, group * rows, last - first), values_h[:, first:last])
        out[start:end] = (
            tile_out.view(num_kv_heads, group, rows, head_dim).permute(2, 0, 1, 3).reshape(rows, num_heads, head_dim)
        )
    return out
