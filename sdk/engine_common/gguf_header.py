"""A GGUF file's header read directly, with the standard library only: the sampling defaults a
model declares (sdk.engine_common.sampling_defaults) and the model fingerprint a probe is tied to
(confidence.gguf_fingerprint) both come from it, and neither the device tier nor the engines
need the gguf package for them (its reader parses every array: a 49k-token vocabulary, ~2.5 s).

Layout (v2/v3): magic, version (u32), tensor count (u64), metadata count (u64), the metadata
key/values, then each tensor's info; little-endian, or big-endian throughout."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Container
from typing import Any, NamedTuple

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# GGUF value types: scalar struct formats by type id; 8 is a string, 9 an array.
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING_TYPE, ARRAY_TYPE, UINT32_TYPE = 8, 9, 4


class GGUFFormatError(ValueError):
    """The file is not a GGUF (v2/v3) this parser can read."""


class GGUFScalar(NamedTuple):
    """A scalar metadata value and its GGUF type id (some keys are meant to have one type only)."""

    value_type: int
    value: Any


class GGUFHeaderReader:
    """Reads little- or big-endian GGUF header fields from a buffer (bytes or a memory map), bounds-checked."""

    def __init__(self, buffer, path: str):
        self.buffer, self.path, self.offset = buffer, path, 0
        self.endian = "<"

    def truncated(self, offset: int) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: truncated GGUF header at byte {offset}")

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.buffer):
            raise self.truncated(self.offset)
        (value,) = struct.unpack_from(self.endian + fmt, self.buffer, self.offset)
        self.offset += size
        return value

    def skip(self, num_bytes: int) -> None:
        if num_bytes < 0 or self.offset + num_bytes > len(self.buffer):
            raise self.truncated(self.offset)
        self.offset += num_bytes

    def string(self) -> bytes:
        length = self.take("Q")
        start = self.offset
        self.skip(length)
        return bytes(self.buffer[start : self.offset])

    def skip_value(self, value_type: int) -> None:
        if value_type in SCALAR_FORMATS:
            self.skip(struct.calcsize(SCALAR_FORMATS[value_type]))
        elif value_type == STRING_TYPE:
            self.skip(self.take("Q"))
        elif value_type == ARRAY_TYPE:
            element_type, count = self.take("I"), self.take("Q")
            if element_type in SCALAR_FORMATS:
                self.skip(count * struct.calcsize(SCALAR_FORMATS[element_type]))
            elif element_type == STRING_TYPE:
                self._skip_strings(count)
            else:
                for _ in range(count):
                    self.skip_value(element_type)
        else:
            raise GGUFFormatError(f"{self.path}: unknown GGUF value type {value_type}")

    def _skip_strings(self, count: int) -> None:
        # The vocabulary is most of a header: a bare loop reads a header about 4x faster than take() and
        # skip() per string (the local tier reads a header as it starts). When it runs off the end,
        # the checked loop goes again to say where.
        unpack_length = struct.Struct(self.endian + "Q").unpack_from
        buffer, offset = self.buffer, self.offset
        try:
            for _ in range(count):
                offset += 8 + unpack_length(buffer, offset)[0]
        except struct.error:
            offset = len(buffer) + 1
        if offset > len(buffer):
            for _ in range(count):
                self.skip(self.take("Q"))
        self.offset = offset


def read_gguf_metadata(reader: GGUFHeaderReader, wanted: Container[str]) -> tuple[int, dict[str, GGUFScalar]]:
    """Reads a header up to the end of its metadata: (the number of tensors, the scalar values of the
    `wanted` keys); the reader is left at the tensor infos. GGUFFormatError for what is not GGUF v2/v3."""
    magic = bytes(reader.buffer[: len(GGUF_MAGIC)])
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(f"{reader.path}: not a GGUF file (magic {magic!r})")
    reader.skip(len(GGUF_MAGIC))
    version = reader.take("I")
    if version > 0xFFFF:  # a big-endian file read as little-endian
        reader.endian, reader.offset = ">", len(GGUF_MAGIC)
        version = reader.take("I")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFFormatError(f"{reader.path}: GGUF version {version} is not supported (2 or 3 are)")
    num_tensors, num_metadata = reader.take("Q"), reader.take("Q")
    found: dict[str, GGUFScalar] = {}
    for _ in range(num_metadata):
        key = reader.string().decode("utf-8", errors="replace")
        value_type = reader.take("I")
        if key in wanted and value_type in SCALAR_FORMATS:
            found[key] = GGUFScalar(value_type, reader.take(SCALAR_FORMATS[value_type]))
        else:
            reader.skip_value(value_type)
    return num_tensors, found


def gguf_metadata(path: str, wanted: Container[str]) -> dict[str, Any]:
    """The scalar values of the `wanted` keys of a GGUF file's header, read through a memory map
    (a file read per skipped string took ~0.25 s of the local tier's start); {} for a file that
    is not GGUF, which simply declares nothing."""
    with open(path, "rb") as handle:
        if handle.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            return {}
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as header:
            _num_tensors, found = read_gguf_metadata(GGUFHeaderReader(header, path), wanted)
    return {key: scalar.value for key, scalar in found.items()}
