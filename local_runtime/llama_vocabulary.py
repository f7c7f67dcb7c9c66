"""The vocabulary half of the llama.cpp backend: tokenizing, token bytes and texts, and the GGUF's metadata.

Kept apart from decoding (llama_backend.LlamaBackend, which is one of these) because none of it
touches the context or the KV cache: it reads the loaded model only.
"""

from __future__ import annotations

import ctypes


class LlamaVocabulary:
    """What a loaded model's vocabulary and metadata say, through llama.cpp's C API (`lib`)."""

    def __init__(self, lib, model):
        self._lib = lib
        self.model = model
        self.vocab = lib.llama_model_get_vocab(model)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self._piece_cache: dict[int, bytes] = {}
        self._max_token_bytes: int | None = None

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (self._lib.llama_token * capacity)()
        n = self._lib.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (self._lib.llama_token * capacity)()
            n = self._lib.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token adds to the text (special tokens render as nothing)."""
        piece = self._piece_cache.get(token_id)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = self._lib.llama_token_to_piece(self.vocab, token_id, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lib.llama_token_to_piece(self.vocab, token_id, buf, -n, 0, False)
            piece = buf.raw[:n]
            self._piece_cache[token_id] = piece
        return piece

    def vocabulary(self) -> list[str]:
        """The vocabulary's token strings in id order, as the GGUF stores them (for fingerprints)."""
        get_text = self._lib.llama_vocab_get_text
        return [get_text(self.vocab, i).decode("utf-8", errors="surrogateescape") for i in range(self.n_vocab)]

    def token_text(self, token_id: int) -> str:
        """A token as text for logprobs listings (special tokens shown by name)."""
        buf = ctypes.create_string_buffer(128)
        n = self._lib.llama_token_to_piece(self.vocab, token_id, buf, 128, 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    def max_token_bytes(self) -> int:
        """The longest text any one token stands for, special tokens' names included: a text of
        B bytes is at least B / max_token_bytes() tokens, whatever the tokenizer does with it."""
        if self._max_token_bytes is None:
            # A token's stored text is never shorter in UTF-8 than what it renders to (byte-level BPE
            # stores each byte as a 1-2 byte character, SentencePiece "▁" (3 bytes) for a space, byte
            # tokens "<0x0A>" for one byte, special tokens render as their own text), so only tokens
            # whose stored text is longer than the longest rendering found so far can raise it: visit
            # them longest first and stop there. Rendering all 49k tokens took ~0.5 s of every start.
            get_text = self._lib.llama_vocab_get_text
            stored = [len(get_text(self.vocab, i)) for i in range(self.n_vocab)]  # UTF-8 bytes, as the GGUF has them
            longest = 1
            for token_id in sorted(range(self.n_vocab), key=stored.__getitem__, reverse=True):
                if stored[token_id] <= longest:
                    break
                longest = max(longest, self._rendered_bytes(token_id))
            self._max_token_bytes = longest
        return self._max_token_bytes

    def max_token_bytes_exhaustive(self) -> int:
        """max_token_bytes() by rendering every token (what the shortcut must agree with; tests)."""
        return max(1, *(self._rendered_bytes(i) for i in range(self.n_vocab)))

    def _rendered_bytes(self, token_id: int) -> int:
        """The longer of a token's two renderings: in generated text, and by name (special tokens)."""
        return max(len(self.token_bytes(token_id)), len(self.token_text(token_id).encode("utf-8")))

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self.vocab, token_id))

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = self._lib.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            self._lib.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def special_token_text(self, which: str) -> str:
        """Text of the model's bos/eos token, for chat templates that print them."""
        fn = {"bos": self._lib.llama_vocab_bos, "eos": self._lib.llama_vocab_eos}[which]
        token_id = fn(self.vocab)
        return self.token_text(token_id) if token_id >= 0 else ""

    @property
    def eos_token_id(self) -> int:
        return int(self._lib.llama_vocab_eos(self.vocab))

    @property
    def adds_bos(self) -> bool:
        return bool(self._lib.llama_vocab_get_add_bos(self.vocab))
