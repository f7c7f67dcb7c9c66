"""What the attention layers need to read and write the paged KV cache for one flattened batch.

The runner builds one of these per step; the model passes it down untouched. A batch
is the concatenation of every scheduled request's new tokens, decode requests first
(one query token each), then prefill chunks (one or more query tokens each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Layout of one flattened batch over the paged KV cache."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset where each new token's K/V goes
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64: each sequence's blocks in order, padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int64: context length after this step (cached + new tokens)
    query_start_loc: list[int]  # num_seqs + 1 offsets into the batch: sequence i owns tokens [qsl[i], qsl[i+1])
    seq_lens_list: list[int]  # seq_lens as Python ints (slicing without a device sync)
    num_decodes: int  # the first num_decodes sequences have exactly one query token each
    block_size: int
    # A native decode-attention kernel (query, key_cache, value_cache, block_tables, seq_lens,
    # scale) -> output, or None for the portable gather + SDPA path; chosen by the runner.
    decode_kernel: Callable | None = None
    # Layout-derived tensors (gather indices, masks) that attention builds once per step
    # and every layer reuses; filled lazily by cloud_engine.attention, never by the runner.
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes


@dataclass
class DecodeMetadata:
    """A decode-only step laid out in preallocated buffers (cloud_engine.compiled_decode).

    Tensors only, one row per sequence, so a compiled graph has no Python values to guard on or
    to specialize to: attention runs as one `tandem::paged_decode_attention` op per layer.
    """

    slot_mapping: torch.Tensor  # [rows] int64: where each row's new K/V goes
    block_tables: torch.Tensor  # [rows, max_blocks_per_seq] int64; a row reads only its first blocks
    seq_lens: torch.Tensor  # [rows] int64: context length after this step
    native: bool  # the CPU decode kernel (cloud_engine.kernels), else the portable path
