"""A 16-bit copy of a quantized model's weights, for prefill.

llama.cpp's CPU matmuls for some weight types (Q4_1, Q5_1 and the K-quants among them) have no
tiled GEMM kernel (llamafile's sgemm, or a repacked layout): a prompt's rows each take the
one-row dot-product path, so a 128-token prompt of the embedded SmolLM2 Q4_1 prefills several
times slower per token than a BF16 copy of the same weights does through sgemm on a CPU with
AVX512-BF16. The copy is also closer to the model file: llama.cpp quantizes the activations to
8 bits for its Q4_1 dot products, while the 16-bit copy keeps the dequantized weights (F16:
almost exactly; BF16: to 8 bits of mantissa) and 16-bit activations (README "Prefill weights").

Decoding stays on the quantized weights, which read a quarter of the bytes per token. The engine
runs prompts through a second context on the copy and moves their KV cells into the main context
(local_runtime.prefill_context).

The copy is made once with llama.cpp's own converter (llama_model_quantize, requantizing to F16
or BF16) and cached on disk beside other tandem caches, keyed by the source file's path, size and
modification time and the llama-cpp-python version.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger("tandem.local")

PREFILL_WEIGHTS = ("auto", "bf16", "f16", "off")
# GGUF general.file_type values (llama_ftype) whose weights are already 16 or 32 bits: no copy helps.
_UNQUANTIZED_FILE_TYPES = {"0", "1", "32"}  # ALL_F32, MOSTLY_F16, MOSTLY_BF16
AUTO_MEMORY_SHARE = 8  # `auto` takes a copy only up to 1/8 of physical memory


def cpu_has_bf16_dot() -> bool:
    """Whether the CPU reports AVX512-BF16 (the BF16 GEMM the measurement was made on).

    Read from /proc/cpuinfo (Linux); elsewhere False, so `auto` stays off where it was not measured."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512_bf16" in line.split()
    except OSError:
        pass
    return False


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def resolve_prefill_weights(setting: str, file_type: str | None, has_bf16_dot: bool, copy_bytes: int = 0,
                            memory_bytes: int | None = None) -> str | None:
    """The 16-bit type to prefill through ("bf16" or "f16"), or None for the model's own weights.

    `auto` picks BF16 on CPUs with AVX512-BF16 (measured: bench.local_prefill) and nothing elsewhere,
    and only while the copy (`copy_bytes`, 2 a weight) takes at most an eighth of the machine's memory:
    a large model's copy would cost an app more memory than it saves time. A model that is already 16
    or 32 bits needs no copy whatever the setting."""
    if setting not in PREFILL_WEIGHTS:
        raise ValueError(f"prefill_weights must be one of {', '.join(PREFILL_WEIGHTS)}, got {setting!r}")
    if setting == "off" or file_type in _UNQUANTIZED_FILE_TYPES:
        return None
    if setting == "auto":
        fits = memory_bytes is None or copy_bytes * AUTO_MEMORY_SHARE <= memory_bytes
        return "bf16" if has_bf16_dot and fits else None
    return setting


def cache_dir() -> Path:
    explicit = os.environ.get("TANDEM_PREFILL_WEIGHTS_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tandem" / "prefill-weights"


def prefill_copy_path(model_path: str, kind: str) -> str:
    """The path of `model_path`'s `kind` copy, converting it first if it is not cached yet."""
    import llama_cpp  # its version is part of the key: another llama.cpp may convert otherwise

    from local_runtime.llama_backend import convert_weights

    source = Path(model_path).resolve()
    stat = source.stat()
    key = hashlib.sha256(f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{kind}|{llama_cpp.__version__}".encode()).hexdigest()[:16]
    directory = cache_dir()
    target = directory / f"{source.stem}.{key}.{kind}.gguf"
    if target.is_file():
        return str(target)
    directory.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed into place: another process converting at the same
    # time, or a crash halfway, never leaves a partial file under the target's name.
    fd, partial = tempfile.mkstemp(prefix=target.name, suffix=".partial", dir=directory)
    os.close(fd)
    try:
        logger.info("converting %s to %s for prefill (once; cached at %s)", source.name, kind.upper(), target)
        convert_weights(str(source), partial, kind)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return str(target)
