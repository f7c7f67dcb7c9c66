"""glibc's count of heap bytes in use, for tests that pin "this leaves the heap flat"."""

from __future__ import annotations

import ctypes
import functools
import platform
from typing import Callable

import pytest

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="not glibc: reads glibc's mallinfo2")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.lru_cache(maxsize=1)
def _mallinfo2():
    mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    mallinfo2.restype = _MallInfo2
    return mallinfo2


def malloc_in_use_bytes() -> int:
    """Bytes malloc has handed out and not had back: heap chunks in use plus mmap'd blocks."""
    info = _mallinfo2()()
    return info.uordblks + info.hblkhd


def heap_growth(work: Callable[[], object]) -> int:
    """Bytes in use after `work()` beyond those in use before it."""
    before = malloc_in_use_bytes()
    work()
    return malloc_in_use_bytes() - before
