"""Rotary position embeddings in Hugging Face's rotate-half layout.

Each head's first half of dimensions pairs with its second half (HF checkpoints; GGUF
loading undoes llama.cpp's interleaved permutation to get here). Positions are given
per token, so one call serves any mix of decodes and prefill chunks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def rope_inverse_frequencies(head_dim: int, theta: float, rope_scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """float32 [head_dim // 2] on CPU: the angle per position of each rotated pair, scaling applied."""
    # Explicit CPU: models are built under torch.device("meta"), which would capture this too.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = (rope_scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope_scaling)
    if rope_type == "per_frequency":
        return inv_freq / torch.tensor(rope_scaling["factors"], dtype=torch.float32, device="cpu")
    raise ValueError(f"rope_type {rope_type!r} is not supported (validated configs never get here)")


def _llama3_scaled(inv_freq: torch.Tensor, rope_scaling: Mapping[str, Any]) -> torch.Tensor:
    # Llama 3.1: wavelengths longer than the original context are stretched by `factor`,
    # short ones are kept, and the band between is interpolated linearly in 1/wavelength.
    factor = float(rope_scaling["factor"])
    low, high = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
    original_context = float(rope_scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    stretched = inv_freq / factor
    blend = ((original_context / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    mixed = (1 - blend) * stretched + blend * inv_freq
    return torch.where(
        wavelength > original_context / low,
        stretched,
        torch.where(wavelength < original_context / high, inv_freq, mixed),
    )


class RotaryEmbedding:
    """cos/sin tables for arbitrary per-token positions; not an nn.Module (no weights, no state_dict).
    `rotary_dim` is the rotated share of a head (the head's width but for partial rotary)."""

    def __init__(self, rotary_dim: int, theta: float, rope_scaling: Mapping[str, Any] | None = None):
        self.rotary_dim = rotary_dim
        self._inv_freq_cpu = rope_inverse_frequencies(rotary_dim, theta, rope_scaling)
        self._inv_freq_by_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each [num_tokens, rotary_dim] in `dtype`, for int positions [num_tokens]."""
        inv_freq = self._inv_freq_by_device.get(positions.device)
        if inv_freq is None:
            inv_freq = self._inv_freq_by_device[positions.device] = self._inv_freq_cpu.to(positions.device)
        # float32 angles like HF, so long positions keep the same precision in bf16 models.
        angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] by per-token (cos, sin) [num_tokens, rotary_dim]: the first
    rotary_dim dimensions of each head turn, the rest pass through (partial rotary, as Phi-3 and HF do)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
