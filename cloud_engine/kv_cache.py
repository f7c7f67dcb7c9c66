"""Sizing and allocating the paged KV cache from a memory budget.

Per layer one key and one value tensor of shape [num_blocks, block_size, num_kv_heads,
head_dim]. The number of blocks is what the budget buys, never a constant: an explicit
`kv_cache_gb`, or a fraction of the memory still free once the weights are loaded.
"""

from __future__ import annotations

import os

import torch

from cloud_engine.config import CloudEngineConfig
from cloud_engine.kv_quant import cache_row_width

GIB = 1024**3
_DEFAULT_FRACTION = {"cuda": 0.9, "cpu": 0.05}


class KVCacheBudgetError(ValueError):
    """The budget cannot hold even one request of the configured length."""


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Key + value bytes of one block across every layer in cache element type `dtype` (int8: scales included)."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * cache_row_width(head_dim, dtype) * element_size


def free_memory_bytes(device: torch.device) -> int:
    """Memory still free on the device (CUDA: the driver's view; CPU: MemAvailable)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def kv_budget_bytes(config: CloudEngineConfig, device: torch.device) -> int:
    if config.kv_cache_gb is not None:
        return int(config.kv_cache_gb * GIB)
    fraction = config.kv_cache_memory_fraction or _DEFAULT_FRACTION.get(device.type, 0.05)
    return int(free_memory_bytes(device) * fraction)


def num_blocks_for_budget(budget_bytes: int, block_bytes: int) -> int:
    return budget_bytes // block_bytes


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zeroed (key, value) caches per layer, in `dtype` (int8: quantized rows, cloud_engine.kv_quant).

    Zeroed, not empty: attention gathers whole blocks, and a never-written slot holding
    NaN bits would turn a masked-out score's zero weight into NaN.
    """
    shape = (num_blocks, block_size, num_kv_heads, cache_row_width(head_dim, dtype))
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]
