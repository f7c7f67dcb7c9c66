"""The paged KV cache in 8 bits: int8 values with one float16 scale per token and K/V head.

A quantized cache is an int8 tensor [num_blocks, block_size, num_kv_heads, head_dim + 2]: each
(token, head) row holds its head_dim values as round(x / scale) in [-127, 127], then its scale's two
bytes (float16, the row's largest magnitude / 127). So a cache is still one tensor per layer for K and
one for V, every function that takes the caches keeps its signature, block ids and prefix sharing are
unchanged, and the row says by its dtype and width that it is quantized.

Why per token and head, not per block (vLLM's fp8 uses one scale per tensor, others one per block): a
row is written once, when its token is computed, so its scale is known then and never changes; a block's
scale would have to grow with a later, larger token and rescale what the block already holds. It costs
2 bytes per head_dim values: at SmolLM2's head_dim 64 a token takes 66 bytes per head against bf16's
128, 1.94x the tokens in the same memory (float32 scales would give 1.88x).

Writers quantize (attention.write_kv_cache, the compiled step's write-and-attend); readers dequantize
(the portable paths here, the CPU decode kernel in cloud_engine/kernels/paged_decode_cpu.cpp).
"""

from __future__ import annotations

import torch

SCALE_BYTES = 2  # one float16 per row
_QMAX = 127.0
# Scales stay in float16's normal range, so the kernel's conversion needs no subnormal case: a row
# whose largest magnitude is below 127 * 2**-14 (~0.008) keeps that scale, which costs it nothing
# in absolute error (at most half a step, 3e-5).
_MIN_SCALE = 2.0**-14
_MAX_SCALE = 65504.0


def cache_row_width(head_dim: int, kv_dtype: torch.dtype) -> int:
    """Elements of one (token, head) row of a cache in `kv_dtype`: head_dim, plus the scale's bytes for int8."""
    return head_dim + SCALE_BYTES if kv_dtype == torch.int8 else head_dim


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] float -> int8 [..., head_dim + 2]: the rounded values, then the row's float16 scale."""
    scale = (x.detach().abs().amax(dim=-1, keepdim=True).float() / _QMAX).clamp(_MIN_SCALE, _MAX_SCALE).half()
    values = torch.round(x.float() / scale.float()).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return torch.cat([values, scale.view(torch.int8)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., head_dim + 2] -> [..., head_dim] in `dtype` (values times the row's scale)."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.float16).float()
    return (rows[..., :head_dim].float() * scale).to(dtype)


def as_cache_rows(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """`x` [..., head_dim] in the form `cache` stores: quantized for an int8 cache, else in its dtype."""
    if is_quantized(cache):
        return x if x.dtype == torch.int8 else quantize_rows(x)
    return x.to(cache.dtype)


def read_cache_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows read from a cache as `dtype` values [..., head_dim] (dequantized when the cache is int8)."""
    return dequantize_rows(rows, dtype) if is_quantized(rows) else rows


# The 16/32-bit element types [cloud] kv_cache_dtype may name (each only as the engine's own dtype).
_NAMED_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_kv_cache_dtype(setting: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for [cloud] kv_cache_dtype; a 16/32-bit type other than the model's is refused
    (the kernels read a cache in the model's dtype or in int8)."""
    if setting == "auto":
        return model_dtype
    if setting == "int8":
        return torch.int8
    named = _NAMED_DTYPES[setting]
    if named != model_dtype:
        engine_dtype = str(model_dtype).removeprefix("torch.")
        raise ValueError(
            f"kv_cache_dtype {setting!r} with the engine's dtype {engine_dtype}: a 16/32-bit cache must be the "
            "engine's dtype; use auto, or int8 for an 8-bit cache"
        )
    return named
