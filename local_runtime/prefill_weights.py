"""A 16-bit copy of a quantized model's weights, for prefill: made, cached, pruned.

llama.cpp's CPU matmuls for some weight types (Q4_1, Q5_1 and the K-quants among them) have no
tiled GEMM kernel (llamafile's sgemm, or a repacked layout): a prompt's rows each take the
one-row dot-product path, so a 128-token prompt of the embedded SmolLM2 Q4_1 prefills several
times slower per token than a BF16 copy of the same weights does through sgemm on a CPU with
AVX512-BF16. Whether a copy wins on a given CPU and model is measured, not assumed
(local_runtime.prefill_choice).

Decoding stays on the quantized weights, which read a quarter of the bytes per token. The engine
runs prompts through a second context on the copy and moves their KV cells into the main context
(local_runtime.prefill_context).

The copy is made once with llama.cpp's own converter (llama_model_quantize, requantizing to F16
or BF16) and cached on disk beside other tandem caches, keyed by the source file's path, size and
modification time and the llama-cpp-python version; the least recently used copies beyond
MAX_CACHE_BYTES are removed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("tandem.local")

PREFILL_WEIGHTS = ("auto", "bf16", "f16", "off")
COPY_KINDS = ("bf16", "f16")
# GGUF general.file_type values (llama_ftype) whose weights are already 16 or 32 bits: no copy helps.
UNQUANTIZED_FILE_TYPES = {"0", "1", "32"}  # ALL_F32, MOSTLY_F16, MOSTLY_BF16
# Copies are 2 bytes a weight: the embedded model's pair is ~0.5 GB, a 7B model's one copy 14 GB.
MAX_CACHE_BYTES = 8 << 30


def cache_dir() -> Path:
    explicit = os.environ.get("TANDEM_PREFILL_WEIGHTS_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tandem" / "prefill-weights"


def model_key(model_path: str) -> str:
    """What identifies a model file here: its resolved path, size and modification time."""
    source = Path(model_path).resolve()
    stat = source.stat()
    return f"{source}|{stat.st_size}|{stat.st_mtime_ns}"


def cached_copy(model_path: str, kind: str) -> Path:
    """Where `model_path`'s `kind` copy is (or would be) cached."""
    import llama_cpp  # its version is part of the key: another llama.cpp may convert otherwise

    key = hashlib.sha256(f"{model_key(model_path)}|{kind}|{llama_cpp.__version__}".encode()).hexdigest()[:16]
    return cache_dir() / f"{Path(model_path).stem}.{key}.{kind}.gguf"


def prefill_copy_path(model_path: str, kind: str) -> str:
    """The path of `model_path`'s `kind` copy, converting it first if it is not cached yet."""
    from local_runtime.llama_backend import convert_weights

    target = cached_copy(model_path, kind)
    if target.is_file():
        _quietly(os.utime, target)  # used now: pruning removes the least recently used
        return str(target)
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    # Written beside the target, flushed to disk, then renamed into place: another process converting
    # at the same time, or a crash halfway (or a power cut before the data reached the disk), never
    # leaves a partial file under the target's name.
    fd, partial = tempfile.mkstemp(prefix=target.name, suffix=".partial", dir=directory)
    os.close(fd)
    try:
        logger.info("converting %s to %s for prefill (once; cached at %s)", Path(model_path).name, kind.upper(), target)
        convert_weights(str(Path(model_path).resolve()), partial, kind)
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    prune_cache(keep=target)
    return str(target)


def discard_copy(path: str) -> None:
    """Remove a cached copy that failed to load, so the next start converts it again."""
    if Path(path).parent == cache_dir():
        _quietly(os.unlink, path)


def prune_cache(keep: Path | None = None, max_bytes: int = MAX_CACHE_BYTES) -> None:
    """Remove the least recently used copies beyond `max_bytes` (never `keep`), and partial files
    a crashed conversion left behind more than a day ago."""
    directory = cache_dir()
    try:
        files = [(p, p.stat()) for p in directory.iterdir() if p.is_file()]
    except OSError:
        return
    copies = sorted(((p, s) for p, s in files if p.suffix == ".gguf"), key=lambda item: item[1].st_mtime, reverse=True)
    total = 0
    for path, stat in copies:
        total += stat.st_size
        if total > max_bytes and path != keep:
            logger.info("removing the prefill copy %s (the cache holds at most %d MiB)", path.name, max_bytes >> 20)
            _quietly(os.unlink, path)
    stale = [p for p, s in files if p.name.endswith(".partial") and s.st_mtime < time.time() - 86400]
    for path in stale:
        _quietly(os.unlink, path)


def memory_limit_bytes(cgroup_file: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """The memory this process may use: physical memory, lowered to its cgroup's limit where one is set
    (a container, a systemd slice); None where neither can be read."""
    limits = [n for n in (_physical_memory_bytes(), *_cgroup_limits(cgroup_file, cgroup_root)) if n]
    return min(limits) if limits else None


def cpu_signature() -> str:
    """What makes one CPU time the paths otherwise than another: its model name and feature flags
    (the first processor's, from /proc/cpuinfo; elsewhere what the platform module says)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if not line.strip() and fields:
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or fields.get("CPU part") or platform.processor() or platform.machine()
    flags = " ".join(sorted((fields.get("flags") or fields.get("Features") or "").split()))
    return f"{name}|{flags}"


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_limits(cgroup_file: str, cgroup_root: str) -> list[int]:
    """The memory limits of this process's cgroup and its ancestors (v2: memory.max; v1:
    memory.limit_in_bytes, whose "no limit" is a huge number that physical memory undercuts)."""
    limits = []
    try:
        with open(cgroup_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return limits
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base, name = Path(cgroup_root), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path(cgroup_root) / "memory", "memory.limit_in_bytes"
        else:
            continue
        here = base / path.lstrip("/")
        while True:
            value = _read_limit(here / name)
            if value is not None:
                limits.append(value)
            if here == base or base not in here.parents:
                break
            here = here.parent
    return limits


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _quietly(function, *args) -> None:
    """Call, ignoring OSError (cache housekeeping never fails a load)."""
    try:
        function(*args)
    except OSError:
        pass
