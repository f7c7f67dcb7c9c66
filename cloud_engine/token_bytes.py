"""The raw bytes of every token of a Hugging Face tokenizer.

Streaming text must be cut at token boundaries without breaking multi-byte characters
(`sdk.engine_common.text_stream.TextStream` takes bytes), and OpenAI's logprobs report each token's
`bytes`. Decoding single ids with `tokenizer.decode` loses both (it strips spaces and
turns half a character into U+FFFD), so we map token strings back to bytes once.
"""

from __future__ import annotations

import json
import re

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's printable-character alphabet for the 256 byte values."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTE_DECODER = _byte_level_decoder()


def _uses_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    return "ByteLevel" in json.dumps(decoder)


def build_token_bytes(tokenizer) -> list[bytes]:
    """bytes for each id in [0, len(tokenizer)); special tokens map to b"" (never shown as text)."""
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    special_ids = set(tokenizer.all_special_ids)
    byte_level = _uses_byte_level(tokenizer)
    table = []
    for token_id, token in enumerate(tokens):
        if token is None or token_id in special_ids:
            table.append(b"")
        elif byte_level:
            if all(c in _BYTE_DECODER for c in token):
                table.append(bytes(_BYTE_DECODER[c] for c in token))
            else:  # an added token written in plain text
                table.append(token.encode("utf-8"))
        elif match := _BYTE_TOKEN.fullmatch(token):
            table.append(bytes([int(match.group(1), 16)]))
        else:  # SentencePiece: U+2581 marks a space
            table.append(token.replace("\u2581", " ").encode("utf-8"))
    return table
