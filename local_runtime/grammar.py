"""Constrained decoding on the local tier: llguidance masks over llama.cpp's vocabulary.

One `LLTokenizer` per engine, built on first use from the raw bytes of every token id (what
llama.cpp reads from the GGUF; ~0.1 s for SmolLM2's 49k tokens), and one `LLMatcher` per
constrained request. Each step the sampler gets the matcher's allowed-token mask for the row,
and the engine feeds the sampled token back; the matcher says when the output is complete.
Chosen by measurement (bench.grammar_libraries: full JSON Schema coverage on its set, sub-ms
compiles, microsecond masks, no dependencies: README).
"""

from __future__ import annotations

import json

import numpy as np

from sdk.protocol.engine import InvalidRequestError, StructuredOutput


# Whitespace between JSON tokens: at most 16 spaces or newlines per gap (a pretty-printer's
# indentation), never unbounded, so a small model cannot pad until max_tokens. Not compact: the
# 135M model was trained on pretty-printed JSON, and with no whitespace allowed its free object
# keys degenerated (`{"🌍🌍🌍...` until max_tokens on 5 of 5 json_object requests, greedy and
# sampled; with this pattern it writes `{\n  "name": "Luna",\n  "age": 12, ...`).
JSON_FORMAT = {"whitespace_flexible": False, "whitespace_pattern": r"[ \n]{0,16}"}


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads: token bytes, special ids, and a tokenizer."""

    def __init__(self, backend, eos_token_id: int):
        self.tokens = [backend.token_bytes(i) for i in range(backend.n_vocab)]
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        self.special_token_ids = [i for i, raw in enumerate(self.tokens) if not raw]  # control tokens render as nothing
        self._backend = backend

    def __call__(self, text) -> list[int]:
        text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        return self._backend.tokenize(text, add_special=False, parse_special=False)


class GrammarMasks:
    """Matchers for structured requests, and their masks as boolean arrays over the vocabulary."""

    def __init__(self, backend, eos_token_id: int):
        self._backend, self._eos = backend, eos_token_id
        self._tokenizer = None  # built on the first structured request

    def matcher(self, structured: StructuredOutput):
        """A fresh matcher; InvalidRequestError (naming response_format) for a schema it cannot take."""
        import llguidance

        if self._tokenizer is None:
            self._tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(self._backend, self._eos)))
        schema = json.loads(structured.schema) if structured.schema is not None else {"type": "object"}
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_FORMAT)
            matcher = llguidance.LLMatcher(self._tokenizer, grammar)
        except Exception as exc:  # noqa: BLE001  (whatever llguidance raises about a schema is the client's 400)
            raise InvalidRequestError(f"response_format: the JSON schema cannot be used: {exc}", "response_format") from None
        if matcher.is_error():
            raise InvalidRequestError(f"response_format: the JSON schema cannot be used: {matcher.get_error()}", "response_format")
        return matcher

    def allowed(self, matcher) -> np.ndarray:
        """Boolean [n_vocab]: the tokens the matcher allows next."""
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        bitmask = allocate_token_bitmask(1, self._tokenizer.vocab_size)
        fill_next_token_bitmask(matcher, bitmask, 0)
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")
        return bits[: self._backend.n_vocab].astype(bool)
