"""A stable id of a local GGUF model, so a probe trained on one model's signals is never
silently applied to another's.

Choice: SHA-256 over the file size, the whole GGUF header (metadata key/values and every
tensor's name, shape, type and offset), the first MiB after it (the start of the tensor
data) and the last MiB of the file. The header alone pins architecture, tokenizer,
quantization and shapes; the two data samples tell apart fine-tunes or requantizations
that share a header. Cost: the header (a few MiB with a large vocabulary) plus 2 MiB of
reads through mmap, milliseconds even for a multi-GB file. Hashing the whole file would
be exact but takes seconds per GB on a phone. Parsed here (numpy-free, stdlib only) so
the on-device side needs no `gguf` package."""

from __future__ import annotations

import hashlib
import mmap
import os
import struct

FINGERPRINT_SCHEME = b"tandem-gguf-fingerprint-v1"
SAMPLE_BYTES = 1 << 20
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value type -> byte size, for the fixed-size types; 8 is string, 9 is array.
FIXED_VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING_TYPE, ARRAY_TYPE, UINT32_TYPE = 8, 9, 4


class GGUFFormatError(ValueError):
    """The file is not a GGUF (v2/v3) this parser can read."""


class _HeaderCursor:
    """Reads little- or big-endian GGUF header fields from a buffer, bounds-checked."""

    def __init__(self, buffer, path: str):
        self.buffer, self.path, self.offset = buffer, path, 0
        self.endian = "<"

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.buffer):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header at byte {self.offset}")
        (value,) = struct.unpack_from(self.endian + fmt, self.buffer, self.offset)
        self.offset += size
        return value

    def skip(self, num_bytes: int) -> None:
        if num_bytes < 0 or self.offset + num_bytes > len(self.buffer):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header at byte {self.offset}")
        self.offset += num_bytes

    def string(self) -> bytes:
        length = self.take("Q")
        start = self.offset
        self.skip(length)
        return bytes(self.buffer[start : self.offset])

    def skip_value(self, value_type: int) -> None:
        if value_type in FIXED_VALUE_SIZES:
            self.skip(FIXED_VALUE_SIZES[value_type])
        elif value_type == STRING_TYPE:
            self.skip(self.take("Q"))
        elif value_type == ARRAY_TYPE:
            element_type, count = self.take("I"), self.take("Q")
            if element_type in FIXED_VALUE_SIZES:
                self.skip(count * FIXED_VALUE_SIZES[element_type])
            else:
                for _ in range(count):
                    self.skip_value(element_type)
        else:
            raise GGUFFormatError(f"{self.path}: unknown GGUF value type {value_type}")


def gguf_header_layout(buffer, path: str = "<buffer>") -> tuple[int, int]:
    """(byte offset where the tensor infos end, tensor data alignment) of a GGUF file."""
    cursor = _HeaderCursor(buffer, path)
    if bytes(buffer[:4]) != GGUF_MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file (magic {bytes(buffer[:4])!r})")
    cursor.skip(4)
    version = cursor.take("I")
    if version > 0xFFFF:  # a big-endian file read as little-endian
        cursor.endian, cursor.offset = ">", 4
        version = cursor.take("I")
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: GGUF version {version} is not supported (2 or 3 are)")
    num_tensors, num_metadata = cursor.take("Q"), cursor.take("Q")
    alignment = DEFAULT_ALIGNMENT
    for _ in range(num_metadata):
        key, value_type = cursor.string(), cursor.take("I")
        if key == b"general.alignment" and value_type == UINT32_TYPE:
            alignment = cursor.take("I")
        else:
            cursor.skip_value(value_type)
    for _ in range(num_tensors):
        cursor.string()
        num_dims = cursor.take("I")
        cursor.skip(8 * num_dims + 4 + 8)  # dims (u64 each), type (u32), offset (u64)
    return cursor.offset, alignment


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
