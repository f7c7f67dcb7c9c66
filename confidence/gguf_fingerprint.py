"""A stable id of a local GGUF model, so a probe trained on one model's signals is never
silently applied to another's.

Choice: SHA-256 over the file size, the whole GGUF header (metadata key/values and every
tensor's name, shape, type and offset), the first MiB after it (the start of the tensor
data) and the last MiB of the file. The header alone pins architecture, tokenizer,
quantization and shapes; the two data samples tell apart fine-tunes or requantizations
that share a header. Cost: the header (a few MiB with a large vocabulary) plus 2 MiB of
reads through mmap, milliseconds even for a multi-GB file. Hashing the whole file would
be exact but takes seconds per GB on a phone. The header is parsed by sdk.engine_common.gguf_header
(stdlib only), so the on-device side needs no `gguf` package."""

from __future__ import annotations

import hashlib
import mmap
import os
import struct

from sdk.engine_common.gguf_header import (
    GGUF_MAGIC,
    UINT32_TYPE,
    GGUFFormatError,
    GGUFHeaderReader,
    read_gguf_metadata,
)

FINGERPRINT_SCHEME = b"tandem-gguf-fingerprint-v1"
SAMPLE_BYTES = 1 << 20
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"


def gguf_header_layout(buffer, path: str = "<buffer>") -> tuple[int, int]:
    """(byte offset where the tensor infos end, tensor data alignment) of a GGUF file."""
    reader = GGUFHeaderReader(buffer, path)
    num_tensors, found = read_gguf_metadata(reader, {ALIGNMENT_KEY})
    alignment = DEFAULT_ALIGNMENT
    if ALIGNMENT_KEY in found and found[ALIGNMENT_KEY].value_type == UINT32_TYPE:  # the only type GGUF gives it
        alignment = found[ALIGNMENT_KEY].value
    for _ in range(num_tensors):
        reader.string()
        num_dims = reader.take("I")
        reader.skip(8 * num_dims + 4 + 8)  # dims (u64 each), type (u32), offset (u64)
    return reader.offset, alignment


def model_fingerprint_for_gguf(path: str | os.PathLike) -> str:
    """`gguf-sha256:<hex>` identifying the model file at `path` (see module docstring)."""
    path = os.fspath(path)
    with open(path, "rb") as file:
        file_size = os.fstat(file.fileno()).st_size
        if file_size < len(GGUF_MAGIC):
            raise GGUFFormatError(f"{path}: too small to be a GGUF file ({file_size} bytes)")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            header_end, _ = gguf_header_layout(mapped, path)
            digest = hashlib.sha256(FINGERPRINT_SCHEME)
            digest.update(struct.pack("<Q", file_size))
            digest.update(mapped[: min(file_size, header_end + SAMPLE_BYTES)])
            digest.update(mapped[max(0, file_size - SAMPLE_BYTES) :])
    return "gguf-sha256:" + digest.hexdigest()
