"""Linear layers with 8-bit weights ([cloud] weight_dtype = int8): weight-only, symmetric, one scale per output
channel; activations stay in the engine's dtype.

A decode step at a few sequences is bound by reading the weights (SmolLM2-135M: 540 MB a step in float32, 270 MB in
bfloat16); int8 reads a quarter of float32's bytes and half of bfloat16's. Which kernel runs, by activation dtype:

- float32: tandem's kernel (cloud_engine/kernels/int8_linear_cpu.cpp), because `_weight_int8pack_mm` has no fast
  float32 path, and dequantizing the weight every call costs more than the float32 matmul it replaces.
- bfloat16 on a CPU with AVX512-BF16 (Zen 4, Sapphire Rapids and later): tandem's kernel too, its bf16 path (the
  weights widened to bf16 pairs, vdpbf16ps), because there `_weight_int8pack_mm` took twice bf16 F.linear's time at
  32 rows.
- bfloat16 elsewhere, and float16: torch's own `_weight_int8pack_mm` (what torchao's int8 weight-only reduces to on
  CPU, and what inductor lowers).

Each against the others and against F.linear, per shape and row count: bench.int8_linear (docs/cloud-engine.md,
"Weights in 8 bits").

The weights are quantized once at load: scale = max |w| of the row / 127, q = round(w / scale). The reference the tests
hold these layers to is F.linear with the dequantized weight (q * scale).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

TILE = 16  # output channels per tile of the float32 kernel's packed layout
# Where 8-bit weights run. Other devices are refused by name: torch's int8 weight kernel has no CUDA build.
INT8_ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [out, in], float32 scales [out]) with weight ~= q * scale[:, None]; a row of zeros gets scale 1."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    quantized = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return quantized, scales


def pack_tiles(quantized: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 kernel's layout: [tiles, in, 16] int8 (output channels padded with zero rows) and float32 scales
    padded to tiles * 16 (the padding's scale is 0)."""
    out_features, in_features = quantized.shape
    tiles = -(-out_features // TILE)
    padded = quantized.new_zeros((tiles * TILE, in_features))
    padded[:out_features] = quantized
    padded_scales = scales.new_zeros(tiles * TILE)
    padded_scales[:out_features] = scales
    return padded.view(tiles, TILE, in_features).transpose(1, 2).contiguous(), padded_scales.contiguous()


def int8_weights_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why weight_dtype int8 cannot run here, or None when it can."""
    if device.type != "cpu":
        return f"8-bit weights run on CPU only (device is {device}): torch's int8 weight kernel has no CUDA build"
    if dtype not in INT8_ACTIVATION_DTYPES:
        return f"8-bit weights take float32, bfloat16 or float16 activations, not {dtype}"
    if dtype == torch.float32:
        from cloud_engine.custom_ops import load_cpu_ops

        if not load_cpu_ops():
            return "8-bit weights with float32 activations need tandem's CPU kernels, which could not be built here"
    return None


def tandem_kernel_takes_bf16() -> bool:
    """Whether tandem's kernel has its bf16 path in this build (AVX512-BF16), so bf16 activations run it."""
    from cloud_engine.custom_ops import load_cpu_ops

    return load_cpu_ops() and torch.ops.tandem_cpu.int8_linear_native_bf16()


def resolve_weight_dtype(weight_dtype: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether [cloud] weight_dtype asks for int8 weights; a ValueError naming the setting where they cannot run."""
    if weight_dtype == "auto":
        return False
    if weight_dtype != "int8":
        raise ValueError(f"weight_dtype must be auto or int8, got {weight_dtype!r}")
    reason = int8_weights_unsupported(device, dtype)
    if reason is not None:
        raise ValueError(f"weight_dtype int8 cannot be used: {reason}")
    return True


class Int8Linear(nn.Module):
    """y = x (q * scale)^T + b with q int8 and a scale per output channel; inference only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        quantized, scales = quantize_per_channel(weight)
        self.bias = None if bias is None else bias.detach()
        self.tandem_kernel = self.dtype == torch.float32 or (
            self.dtype == torch.bfloat16 and tandem_kernel_takes_bf16()
        )
        if self.tandem_kernel:
            self.weight, self.scales = pack_tiles(quantized, scales)  # tandem_cpu::int8_linear's layout
        else:
            self.weight, self.scales = quantized.contiguous(), scales.to(self.dtype)  # _weight_int8pack_mm's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.tandem_kernel:
            out = torch.ops.tandem_cpu.int8_linear(rows, self.weight, self.scales, self.bias, self.out_features)
        else:
            out = torch._weight_int8pack_mm(rows.to(self.dtype), self.weight, self.scales)
            if self.bias is not None:
                out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """[out, in] float32: q * scale, the weight this layer multiplies by (the tests' reference)."""
        if self.tandem_kernel:
            tiles = self.weight.transpose(1, 2).reshape(-1, self.in_features)[: self.out_features]
            return tiles.float() * self.scales[: self.out_features, None]
        return self.weight.float() * self.scales.float()[:, None]

    def weight_bytes(self) -> int:
        """Bytes a call reads for its weight: the int8 values and the scales (padding included)."""
        return self.weight.numel() + self.scales.numel() * self.scales.element_size()


def quantize_linears(module: nn.Module, keep: Callable[[str], bool] = lambda name: False, prefix: str = "") -> int:
    """Replace every nn.Linear under `module` whose qualified name `keep` refuses by an Int8Linear; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        qualified = f"{prefix}{name}"
        if isinstance(child, nn.Linear) and not keep(qualified):
            setattr(module, name, Int8Linear(child.weight, child.bias))
            count += 1
        elif not isinstance(child, nn.Linear):
            count += quantize_linears(child, keep, qualified + ".")
    return count
