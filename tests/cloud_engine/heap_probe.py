"""glibc's count of heap bytes in use, for tests that pin "this leaves the heap flat"."""

from __future__ import annotations

import ctypes
import platform

import pytest

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="reads glibc's mallinfo2")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_in_use_bytes() -> int:
    """Bytes malloc has handed out and not had back: heap chunks in use plus mmap'd blocks."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd
