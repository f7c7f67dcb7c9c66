"""Keep freed activation memory in the heap, so each engine step does not page-fault it back.

glibc serves large allocations (over 128 KiB to 32 MiB, adaptively) with fresh mmap'd
pages and returns them on free. A CPU forward pass allocates and frees the same
multi-megabyte activations, logits and score tiles every step, so each step paid for
zeroing and faulting in those pages again: measured here, the sampler over 32 x 49152
logits took 10 ms/step with glibc's defaults and 6 ms with large blocks kept in the heap.
The cost is that the process keeps its peak heap instead of returning it to the OS,
which a server holding a KV cache of gigabytes does anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import platform

logger = logging.getLogger("tandem.cloud")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 1 << 30  # allocations below 1 GiB come from the heap
_TRIM_THRESHOLD = (1 << 31) - 1  # never trim the heap top back to the OS


@functools.lru_cache(maxsize=1)
def keep_freed_memory_in_heap() -> bool:
    """Tune glibc's malloc once per process; False (and nothing changed) on other C libraries."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = (
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
            and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
        )
    except (OSError, AttributeError):
        ok = False
    if not ok:
        logger.info("could not tune malloc thresholds; CPU steps may page-fault their activations")
    return ok
