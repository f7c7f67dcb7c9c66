"""An on-disk cache of the slow parts of loading a GGUF file into the cloud engine.

On 2 cores, loading the embedded SmolLM2-135M GGUF spent ~9 s in transformers converting the
file's 49k-token vocabulary to a tokenizer, ~4 s in gguf-py's GGUFReader (it reads the token
arrays element by element, twice: ours and the tokenizer conversion's) and ~3 s dequantizing
4-bit blocks to float32. None of that changes until the file does, so the first load stores its
results and later loads read them back:

- `tokenizer/`: the converted tokenizer, `save_pretrained`'s files (reloaded in ~0.5 s);
- `weights.safetensors`: the float32 tensors exactly as GGUFCheckpoint.weights() yielded them
  (HF names, rope rows restored), written while the model consumes them on the first load;
- `checkpoint.json`: the parsed metadata, tensor names and rope factors ModelConfig is built from.

An entry is keyed by the file's absolute path, size and mtime and by the versions of the code
that produced it, so an edited file or another transformers/gguf is a miss, never a stale hit.
Anything wrong with an entry (half written, removed under us, unreadable) is a miss too: the
slow path is always there. The root is $TANDEM_GGUF_CACHE ("off" disables it), else
$XDG_CACHE_HOME/tandem/gguf or ~/.cache/tandem/gguf.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import torch

from cloud_engine.loader.hf import InvalidModelError
from cloud_engine.model.config import ModelConfig
from cloud_engine.model.registry import get_architecture

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when what an entry holds, or how it is derived, changes
# float32 is ~7x a 4-bit file: bigger checkpoints are not worth the disk (the tokenizer still caches).
MAX_WEIGHTS_BYTES = 2 << 30
MAX_CACHE_BYTES = 4 << 30  # least recently used entries beyond this are removed
CHECKPOINT_FILE, WEIGHTS_FILE, TOKENIZER_DIR = "checkpoint.json", "weights.safetensors", "tokenizer"


def gguf_cache_root() -> Path | None:
    """Where entries live, or None when caching is off ($TANDEM_GGUF_CACHE=off)."""
    configured = os.environ.get("TANDEM_GGUF_CACHE")
    if configured:
        return None if configured.lower() in ("off", "0", "false", "no") else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem" / "gguf"


def entry_dir(gguf_path: str) -> Path | None:
    """This file's entry (it may not exist yet), or None when caching is off or the file cannot be stat'ed."""
    root = gguf_cache_root()
    if root is None:
        return None
    try:
        stat = os.stat(gguf_path)
        versions = [package_version("transformers"), package_version("gguf"), package_version("safetensors")]
    except (OSError, ValueError):
        return None
    key = json.dumps([CACHE_FORMAT, os.path.abspath(gguf_path), stat.st_size, stat.st_mtime_ns, versions])
    return root / hashlib.sha256(key.encode()).hexdigest()[:24]


# -- the tokenizer ---------------------------------------------------------------------------


def load_cached_tokenizer(gguf_path: str):
    """The tokenizer a previous load converted from this file, or None (a miss)."""
    entry = entry_dir(gguf_path)
    if entry is None or not (entry / TOKENIZER_DIR).is_dir():
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(entry / TOKENIZER_DIR))
    except Exception as exc:  # a damaged entry is a miss, whatever transformers raises for it
        logger.warning("ignoring the cached tokenizer in %s: %s", entry, exc)
        return None
    _touch(entry)
    return tokenizer


def store_tokenizer(gguf_path: str, tokenizer) -> None:
    """Keep a converted tokenizer for the next load (best effort: a read-only cache only costs speed)."""
    entry = entry_dir(gguf_path)
    if entry is None:
        return
    try:
        entry.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".tokenizer-", dir=entry)
        try:
            tokenizer.save_pretrained(staging)
            os.rename(staging, entry / TOKENIZER_DIR)  # atomic; fails if another process got there first
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _prune(entry.parent)
    except OSError as exc:
        logger.debug("could not cache the tokenizer of %s: %s", gguf_path, exc)


# -- the checkpoint (metadata and float32 weights) -------------------------------------------


@dataclass
class CachedCheckpoint:
    """What read_gguf_checkpoint would return for an unchanged file, read back from its entry."""

    path: str
    metadata: dict[str, Any]
    config: ModelConfig
    weights_file: Path
    weight_names: list[str]  # in the order GGUFCheckpoint.weights() yields them

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor) pairs, bit for bit those the first load dequantized."""
        from safetensors import safe_open

        with safe_open(str(self.weights_file), framework="pt") as f:
            for name in self.weight_names:  # the file's order (f.keys() sorts them)
                yield name, f.get_tensor(name)


def load_cached_checkpoint(gguf_path: str) -> CachedCheckpoint | None:
    """This file's checkpoint from its entry, or None (a miss)."""
    entry = entry_dir(gguf_path)
    if entry is None or not (entry / CHECKPOINT_FILE).is_file():
        return None
    try:
        saved = json.loads((entry / CHECKPOINT_FILE).read_text(encoding="utf-8"))
        metadata = saved["metadata"]
        get_architecture(metadata["general.architecture"])  # what read_gguf_checkpoint checks
        config = ModelConfig.from_gguf(
            metadata, tensor_names=saved["tensor_names"], rope_freq_factors=saved["rope_freq_factors"]
        )
        if not (entry / WEIGHTS_FILE).is_file() or not isinstance(saved["weight_names"], list):
            return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring the cached checkpoint in %s: %s", entry, exc)
        return None
    _touch(entry)
    return CachedCheckpoint(
        path=gguf_path,
        metadata=metadata,
        config=config,
        weights_file=entry / WEIGHTS_FILE,
        weight_names=saved["weight_names"],
    )


def storing_weights(checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """checkpoint.weights() (a gguf.GGUFCheckpoint), written to the file's entry as they go by.

    The tensors stream to disk one at a time (no second copy of the model in memory); the entry
    is committed only once every planned tensor went by with the planned name and shape, so a
    load that stops half way (an error, a mismatch) leaves no entry behind.
    """
    entry, plan = entry_dir(checkpoint.path), _plan(checkpoint)
    if entry is None or plan is None:
        yield from checkpoint.weights()
        return
    writer = _SafetensorsWriter.open(entry, plan)
    try:
        for index, (name, tensor) in enumerate(checkpoint.weights()):
            if writer is not None:
                writer = writer.write(index, name, tensor)
            yield name, tensor
        if writer is not None:
            record = {**_checkpoint_record(checkpoint), "weight_names": [name for name, _ in plan]}
            committed, writer = writer.commit(record), None  # commit cleans up after itself
            if committed:
                _prune(entry.parent)
    finally:
        if writer is not None:  # the load stopped early (an error, or the consumer closed us)
            writer.drop("the load stopped before its last tensor")


def _plan(checkpoint) -> list[tuple[str, list[int]]] | None:
    """(HF name, shape) of every tensor weights() will yield, in order; None when not cacheable."""
    try:
        plan = checkpoint.weight_plan()
    except InvalidModelError:
        return None  # weights() raises for it; nothing to cache
    if sum(math.prod(shape) for _, shape in plan) * 4 > MAX_WEIGHTS_BYTES:
        return None
    return plan


def _checkpoint_record(checkpoint) -> dict:
    """What load_cached_checkpoint rebuilds the config from: what read_gguf_checkpoint derived it from."""
    return {
        "source": os.path.abspath(checkpoint.path),
        "metadata": checkpoint.metadata,
        "tensor_names": checkpoint.tensor_names,
        "rope_freq_factors": checkpoint.rope_freq_factors,
    }


class _SafetensorsWriter:
    """safetensors' layout written in a stream: the header (known from the plan) first, then each
    tensor's bytes as it arrives. Any failure drops the file and returns None (caching stops)."""

    def __init__(self, entry: Path, plan: list[tuple[str, list[int]]], file, staging: str):
        self.entry, self.plan, self.file, self.staging = entry, plan, file, staging
        self.num_written = 0

    @classmethod
    def open(cls, entry: Path, plan: list[tuple[str, list[int]]]) -> _SafetensorsWriter | None:
        header, offset = {}, 0
        for name, shape in plan:
            size = math.prod(shape) * 4
            header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
        try:
            entry.mkdir(parents=True, exist_ok=True)
            fd, staging = tempfile.mkstemp(prefix=".weights-", dir=entry)
            file = os.fdopen(fd, "wb")
            file.write(struct.pack("<Q", len(encoded)) + encoded)
        except OSError as exc:
            logger.debug("could not cache the weights in %s: %s", entry, exc)
            return None
        return cls(entry, plan, file, staging)

    def write(self, index: int, name: str, tensor: torch.Tensor) -> _SafetensorsWriter | None:
        expected = self.plan[index] if index < len(self.plan) else None
        if index != self.num_written or expected != (name, list(tensor.shape)) or tensor.dtype != torch.float32:
            return self.drop(f"tensor {index} is {name} {list(tensor.shape)} {tensor.dtype}, planned {expected}")
        try:
            self.file.write(tensor.contiguous().numpy().tobytes())
        except OSError as exc:
            return self.drop(str(exc))
        self.num_written += 1
        return self

    def commit(self, record: dict) -> bool:
        """Put the weights, then the record, in place once every planned tensor was written."""
        if self.num_written != len(self.plan):
            self.drop(f"{self.num_written} of {len(self.plan)} tensors went by")
            return False
        try:
            self.file.close()
            os.replace(self.staging, self.entry / WEIGHTS_FILE)
            fd, staging = tempfile.mkstemp(prefix=".checkpoint-", dir=self.entry)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(staging, self.entry / CHECKPOINT_FILE)  # last: its presence means the entry is whole
        except (OSError, TypeError, ValueError) as exc:
            self.drop(str(exc))
            return False
        return True

    def drop(self, why: str) -> None:
        """Stop caching: close and remove the partial file."""
        logger.debug("not caching the weights in %s: %s", self.entry, why)
        self.file.close()
        _quietly(os.unlink, self.staging)
        return None


def _quietly(function, *args) -> None:
    """Call, ignoring OSError (cache housekeeping never fails a load)."""
    try:
        function(*args)
    except OSError:
        pass


def _touch(entry: Path) -> None:
    """Mark an entry used now (pruning removes the least recently used)."""
    _quietly(os.utime, entry)


def _prune(root: Path) -> None:
    """Keep the most recently used entries within MAX_CACHE_BYTES (a cache of float32 weights must not
    grow unbounded). Bytes, not a count: a run of tests loading many tiny files must not evict the
    embedded model's entry that setup filled."""
    try:
        entries = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    total = 0
    for entry in entries:
        total += _entry_bytes(entry)
        if total > MAX_CACHE_BYTES and entry is not entries[0]:  # the newest entry always stays
            shutil.rmtree(entry, ignore_errors=True)


def _entry_bytes(entry: Path) -> int:
    try:
        return sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
    except OSError:
        return 0
