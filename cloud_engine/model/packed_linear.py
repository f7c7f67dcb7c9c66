"""Linear layers with weights pre-packed by oneDNN, for bfloat16 on CPU.

F.linear on bf16 CPU tensors reorders the weight into oneDNN's blocked layout on every
call; packing once at load time removes that. Measured on a 2-core EPYC (AVX512-BF16):
1.5-2x faster at decode batch sizes 1-2 and 1.2x at 32, with bit-identical outputs. The
ops are the ones torch.compile's CPU backend emits (`torch.ops.mkldnn`); a build without
them, a CPU without oneDNN's bf16 path, or a build that disagrees with F.linear on a probe
input keeps the plain layers.

oneDNN builds (JIT-compiles) a primitive for every input row count it meets and keeps it in a
cache of 1024 entries, each with its own scratch memory (~0.45 MB on average over row counts
1-2048, measured). A server's steps carry any token count from 1 to its batch budget, so over
hours the cache fills with one primitive per (row count, weight shape): measured, the cloud
engine's malloc in-use grew 154 MiB over 450 soak requests this way, and each new shape costs
~1.5 ms to build mid-step.
So rows are padded up to a bucket (exact up to 16 rows, then 8 buckets per power of two:
under 12.5% padding), which bounds the primitives to ~60 per weight shape at 512 rows,
and the engine builds them all at load (`warm_up_packed_linears`), so memory is flat after.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("tandem.cloud")

# oneDNN picks the blocked layout for this many rows; any row count works afterwards.
BATCH_HINT = 32
EXACT_ROWS = 16  # decode-sized inputs are never padded
BUCKETS_PER_OCTAVE = 8  # above EXACT_ROWS: this many row counts per power of two


def row_bucket(rows: int) -> int:
    """The row count a `rows`-row input is padded to: itself up to EXACT_ROWS, else rounded up
    to a multiple of 1/BUCKETS_PER_OCTAVE of its power of two."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << max(0, rows.bit_length() - 1 - (BUCKETS_PER_OCTAVE.bit_length() - 1))
    return -(-rows // step) * step


def row_buckets(max_rows: int) -> list[int]:
    """Every bucket an input of 1..max_rows rows can be padded to."""
    return sorted({row_bucket(rows) for rows in range(1, max_rows + 1)})


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's layout; inference only (no gradients, no state_dict weight)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # A compiled decode step (cloud_engine.compiled_decode): its row count is a bucket already, and
            # inductor cannot lower the packed weight itself, so the call is one opaque op (cloud_engine.custom_ops).
            return torch.ops.tandem_cpu.packed_linear(x, self.packed_weight, self.bias, self.out_features)
        rows = x.shape[0]
        padding = row_bucket(rows) - rows if x.dim() == 2 else 0
        if padding:
            x = F.pad(x, (0, 0, 0, padding))
        out = torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        return out[:rows] if padding else out


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this machine can pack: bf16 on a CPU that oneDNN has a bf16 path for (AVX-512
    BW/VL/DQ or AVX-NE-CONVERT on x86, torch's own check), in a torch built with oneDNN."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):  # a torch without the op
        return False


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Packing applies where the machine supports it (packing_supported) and the packed layer
    agrees with F.linear on a probe input: a torch whose packed path is wrong keeps the plain
    layers instead of serving wrong numbers (tests/cloud_engine/test_packed_linear.py fails there)."""
    if not packing_supported(device, dtype):
        return False
    try:
        weight, probe = torch.randn(48, 32, dtype=dtype), torch.randn(3, 32, dtype=dtype)
        packed = PackedLinear(weight, None)(probe)
        agrees = bool(torch.allclose(packed.float(), F.linear(probe, weight).float(), rtol=1e-2, atol=1e-2))
    except (RuntimeError, AttributeError) as error:
        logger.warning("oneDNN weight packing failed on this bf16-capable CPU (%s); using plain linear layers", error)
        return False
    if not agrees:
        logger.warning("oneDNN's packed linear disagrees with F.linear on this machine; using plain linear layers")
    return agrees


def pack_linears(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` by a PackedLinear; returns how many were replaced."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child.weight, child.bias))
            count += 1
        else:
            count += pack_linears(child)
    return count


def warm_up_packed_linears(linears: list[PackedLinear], max_rows: int) -> int:
    """Run one layer of each weight shape once per row bucket up to `max_rows`, so oneDNN builds
    every primitive it will need now instead of mid-step (and the heap stops growing after load).
    Layers of the same shape share primitives. Returns the number of (shape, bucket) pairs run."""
    by_shape = {}
    for linear in linears:
        by_shape.setdefault((linear.in_features, linear.out_features, linear.bias is not None), linear)
    buckets = row_buckets(max_rows)
    with torch.inference_mode():
        for linear in by_shape.values():
            dtype = linear.packed_weight.dtype
            for rows in buckets:
                linear(torch.zeros(rows, linear.in_features, dtype=dtype))
    return len(by_shape) * len(buckets)
