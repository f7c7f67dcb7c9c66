"""The decode step's opaque pieces as torch custom ops, so a compiled decode graph calls them in place.

torch.compile cannot trace into a C++ extension function (the CPU decode-attention kernel) nor
lower oneDNN's opaque packed weights (inductor's own linear lowering asserts on them): either
would break the graph, or fail it. Registered as ops with a fake implementation (the output's
shape from the inputs' shapes), each becomes one node of the graph, and inductor fuses the
elementwise work around them (norms, rotary, SwiGLU, residual adds) into a few C++ loops.
The CPU ones are defined in C++ beside the kernel (load_cpu_ops); the portable decode attention
is a Python op here.

Eager steps never go through these: they call the same functions directly.
"""

from __future__ import annotations

import functools

import torch

from cloud_engine.attention import decode_attention_portable, write_kv_cache


@torch.library.custom_op("tandem::paged_decode_attention", mutates_args=("key_cache", "value_cache"))
def paged_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """The portable path's op (no CPU kernel: CUDA, or attention_backend torch): write one token's K/V
    per sequence, then attend each query to its sequence's context (its last `window` tokens when
    window > 0). query [seqs, heads, dim]; key, value [seqs, kv_heads, dim]; block_tables [seqs, width];
    seq_lens [seqs]."""
    write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    return decode_attention_portable(query, key_cache, value_cache, block_tables, seq_lens, scale, window)


@paged_decode_attention.register_fake
def _(query, key, value, key_cache, value_cache, slot_mapping, block_tables, seq_lens, scale, window=0):
    return torch.empty_like(query)


@torch.library.custom_op("tandem::grouped_mm", mutates_args=())
def grouped_mm(rows: torch.Tensor, weights: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
    """A mixture of experts' grouped matmul (cloud_engine/model/moe.py): rows [n, k] sorted by expert, weights
    [experts, k, m], group_ends [experts] int32; row i of expert e's run times weights[e]. Opaque to the compiled
    step because torch's own shape check for `torch._grouped_mm` accepts bfloat16 only, and the op runs any dtype."""
    return torch._grouped_mm(rows, weights, offs=group_ends)


@grouped_mm.register_fake
def _(rows, weights, group_ends):
    return rows.new_empty((rows.shape[0], weights.shape[-1]))


@functools.cache
def load_cpu_ops() -> bool:
    """Load the CPU kernels' ops (tandem_cpu::write_and_attend, tandem_cpu::packed_linear, defined in
    cloud_engine/kernels/paged_decode_cpu.cpp; tandem_cpu::int8_linear, in int8_linear_cpu.cpp) and give them
    fake implementations; False when the kernels cannot be built here."""
    from cloud_engine.kernels import cpu_kernels

    if cpu_kernels() is None:
        return False

    @torch.library.register_fake("tandem_cpu::write_and_attend")
    def _(query, key, value, key_cache, value_cache, slot_mapping, block_tables, seq_lens, scale, window=0):
        return torch.empty_like(query)

    @torch.library.register_fake("tandem_cpu::packed_linear")
    def _(x, packed_weight, bias, out_features):
        return x.new_empty((x.shape[0], out_features))

    @torch.library.register_fake("tandem_cpu::int8_linear")
    def _(x, packed_weight, scales, bias, out_features):
        return x.new_empty((x.shape[0], out_features))

    return True
