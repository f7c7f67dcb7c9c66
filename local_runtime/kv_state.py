"""llama.cpp's sequence-state bytes, moved between contexts with different stream counts.

`llama_state_seq_get_data` writes a magic number and the sequence id (8 bytes, checked and
skipped on loading), then the KV cache: a uint32 stream count, then per stream a
uint32 cell count followed, when it is not 0, by that stream's cells (positions, then K and V
of every layer). Loading checks the stream count against the context's own and puts the cells
into the stream of the destination sequence, whichever position they had in the bytes. A
sequence's cells live in one stream, so every other stream writes a bare 0.

So a sequence read from a context with one KV stream per slot becomes loadable by a unified
context (one stream) by dropping those zeros, and back by adding them. This holds for one
plain KV cache; a model whose memory writes several caches (sliding-window attention's two,
recurrent state) is not converted (the engine keeps its prompts in the main context).
"""

from __future__ import annotations

import struct

_U32 = struct.Struct("<I")
_HEAD = 8  # the magic and the sequence id


def to_one_stream(data, n_streams: int, stream: int) -> bytes:
    """The bytes of a sequence living in `stream` of `n_streams`, as a one-stream context writes them."""
    found = _U32.unpack_from(data, _HEAD)[0]
    if found != n_streams:
        raise ValueError(f"sequence state of {found} streams, expected {n_streams}")
    if n_streams == 1:
        return bytes(data)
    start = _HEAD + 4 + 4 * stream  # the zeros of the streams before it
    end = len(data) - 4 * (n_streams - 1 - stream)  # the zeros after it
    for offset in [*range(_HEAD + 4, start, 4), *range(end, len(data), 4)]:
        if _U32.unpack_from(data, offset)[0] != 0:
            raise ValueError(f"sequence state holds cells outside stream {stream}")
    return bytes(data[:_HEAD]) + _U32.pack(1) + bytes(data[start:end])


def from_one_stream(data: bytes, n_streams: int) -> bytes:
    """One-stream sequence bytes, as a context of `n_streams` streams reads them."""
    if _U32.unpack_from(data, _HEAD)[0] != 1:
        raise ValueError("expected the sequence state of one stream")
    if n_streams == 1:
        return data
    return data[:_HEAD] + _U32.pack(n_streams) + data[_HEAD + 4 :] + bytes(4 * (n_streams - 1))
