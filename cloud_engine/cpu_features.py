"""What this machine's CPU can do natively, read once from /proc/cpuinfo (empty elsewhere)."""

from __future__ import annotations

import functools
import platform


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The kernel's feature flags for CPU 0 (x86 `flags`, Arm `Features`); empty when unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_native_bf16() -> bool:
    """bfloat16 matmuls run in hardware here (AVX512-BF16 or AMX on x86, BF16 on Arm).

    Where they do, bfloat16 linears measured ~3x faster than float32 on this project's CPUs;
    where they do not, oneDNN emulates them and float32 is the faster choice.
    """
    flags = cpu_flags()
    if platform.machine().lower() in ("arm64", "aarch64"):
        return "bf16" in flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def fingerprint() -> str:
    """Architecture plus feature flags: two machines with the same string run the same -march=native binary."""
    return platform.machine() + " " + " ".join(sorted(cpu_flags()))
