"""Build and load the CPU kernels (paged_decode_cpu.cpp, int8_linear_cpu.cpp) on first use.

The build targets this machine's CPU (-march=native), so the cache key includes the CPU's
feature flags: a cache directory shared with another machine never hands it a binary with
instructions it lacks. A failed build is remembered for the process and logged once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
from pathlib import Path

from cloud_engine.cpu_features import fingerprint

logger = logging.getLogger("tandem.cloud.kernels")

KERNEL_DIR = Path(__file__).parent
SOURCES = [KERNEL_DIR / "paged_decode_cpu.cpp", KERNEL_DIR / "int8_linear_cpu.cpp"]
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp"]


def kernel_cache_dir() -> Path:
    """Where compiled kernels live: $TANDEM_KERNEL_CACHE, else the user's cache directory."""
    configured = os.environ.get("TANDEM_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem" / "kernels"


def cxx_compiler() -> str | None:
    """The C++ compiler torch's extension builder runs ($CXX, else c++), or None when it is not on PATH."""
    return shutil.which(os.environ.get("CXX", "c++"))


# Why the last build failed, for tests: with a compiler present, a failed build is a failure there.
last_build_error: str | None = None


@functools.lru_cache(maxsize=1)
def cpu_kernels():
    """The compiled extension module, or None when it cannot be built here (reason logged)."""
    global last_build_error
    import torch
    from torch.utils import cpp_extension

    _put_ninja_on_path()
    if cxx_compiler() is None:
        logger.warning("no C++ compiler found; cloud engine uses the portable attention path on CPU")
        return None
    code = b"".join(path.read_bytes() for path in SOURCES)
    key = hashlib.sha256(
        code + " ".join(CFLAGS).encode() + fingerprint().encode() + torch.__version__.encode()
    ).hexdigest()[:16]
    build_dir = kernel_cache_dir() / f"paged_decode_cpu_{key}"
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        with _build_lock(build_dir):
            return cpp_extension.load(
                name=f"tandem_paged_decode_cpu_{key}",
                sources=[str(path) for path in SOURCES],
                extra_cflags=CFLAGS,
                build_directory=str(build_dir),
                verbose=False,
            )
    except Exception as error:  # a missing compiler, ninja or header: fall back, never fail the engine
        last_build_error = str(error)
        logger.warning("could not build the CPU attention kernel (%s); using the portable attention path", error)
        return None


@contextlib.contextmanager
def _build_lock(build_dir: Path):
    """Serialize builds with an OS file lock, and clear a `lock` file torch left behind.

    torch's builder marks a build with a plain `lock` file and waits, forever, for it to
    disappear; a process that died mid-build (killed, or exiting while a daemon engine thread
    compiled) leaves it, and every later engine load hung. The flock dies with its process, so
    whoever holds it knows no live tandem process is building here and the file is stale."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock file only
        yield
        return
    with open(build_dir / "tandem-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                logger.warning("removing a stale kernel build lock left by a process that died mid-build: %s", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _put_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the `ninja` wheel (a dependency) keeps it in its own folder."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


BACKENDS = ("auto", "torch", "cpu-kernel")
KERNEL_DTYPES = ("float32", "bfloat16")
MAX_QUERY_VECTORS = 128  # kMaxVectors in the kernel: query heads per K/V head * head_dim / 16


def unsupported_reason(device, dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    """Why the CPU kernel cannot serve this model/device/dtype, or None when it can."""
    if device.type != "cpu":
        return f"it runs on CPU only (device is {device})"
    if str(dtype).removeprefix("torch.") not in KERNEL_DTYPES:
        return f"it supports {' and '.join(KERNEL_DTYPES)} caches, not {dtype}"
    if head_dim % 16 or (num_heads // num_kv_heads) * (head_dim // 16) > MAX_QUERY_VECTORS:
        return f"head_dim {head_dim} with {num_heads // num_kv_heads} query heads per K/V head is outside its limits"
    return None


def select_decode_kernel(backend: str, device, dtype, num_heads: int, num_kv_heads: int, head_dim: int):
    """The decode-attention callable for `backend`, or None for the portable path.

    auto: the CPU kernel where it applies and builds; torch: always portable;
    cpu-kernel: the CPU kernel or a ValueError saying why not.
    """
    if backend not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return None
    reason = unsupported_reason(device, dtype, num_heads, num_kv_heads, head_dim)
    if reason is None:
        kernels = cpu_kernels()
        reason = None if kernels is not None else "it could not be built here (see the warning above)"
    if reason is not None:
        if backend == "cpu-kernel":
            raise ValueError(f"attention_backend cpu-kernel cannot be used: {reason}")
        return None
    return kernels.paged_decode_attention
