"""Constrained decoding (response_format) for both engines: llguidance masks over a vocabulary.

One `LLTokenizer` per engine, built on first use from the raw bytes of every token id (llama.cpp's
from the GGUF on the local tier, the tokenizer's on the cloud engine; ~0.1 s for SmolLM2's 49k
tokens), and one `LLMatcher` per constrained request. Each step the engine's own sampler gets the
matcher's allowed-token mask for the row, and the engine feeds the sampled token back. llguidance
and numpy are imported on first use (sdk.engine_common: machinery both engines share).
Chosen by measurement (bench.grammar_libraries: full JSON Schema coverage on its set, sub-ms
compiles, microsecond masks, no dependencies: docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from sdk.protocol.engine import InvalidRequestError, StructuredOutput
from sdk.engine_common.grammar_closing import ClosingPaths, StructuredState
from sdk.engine_common.json_scan import DuplicateKeyTokens
from sdk.protocol.json_schema_rules import JSON_FORMAT, closed_objects  # noqa: F401  (re-exported)


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads: token bytes, special ids, and a tokenizer."""

    def __init__(self, tokens: list[bytes], eos_token_id: int, tokenize: Callable[[str], list[int]]):
        self.tokens = tokens
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        self.special_token_ids = [i for i, raw in enumerate(tokens) if not raw]  # control tokens render as nothing
        self._tokenize = tokenize

    def __call__(self, text) -> list[int]:
        return self._tokenize(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)


class GrammarMasks:
    """Matchers for structured requests, and their masks as boolean arrays over the vocabulary."""

    def __init__(self, vocabulary: Callable[[], list[bytes]], eos_token_id: int, tokenize: Callable[[str], list[int]]):
        self._vocabulary, self._eos, self._tokenize = (
            vocabulary,
            eos_token_id,
            tokenize,
        )  # token bytes by id, read on first use
        self._tokenizer = None  # built on the first structured request
        self._bitmask = None  # one reused buffer: each engine's step loop is single-threaded
        self._num_tokens = 0
        self._tokens: list[bytes] = []
        self.closing_paths: ClosingPaths | None = None  # sdk.engine_common.grammar_closing, with the tokenizer
        self._duplicate_keys: DuplicateKeyTokens | None = None

    def matcher(
        self, structured: StructuredOutput, consumed: Sequence[int] = (), closes: bool = True
    ) -> StructuredState:
        """A fresh grammar state that has consumed `consumed` (the answer's start, after a hand-off);
        `closes`: the answer closes within its budget (sdk.engine_common.grammar_closing).
        InvalidRequestError (naming response_format, or tools) for a schema it cannot take or a
        start that does not fit it."""
        import llguidance

        if self._tokenizer is None:
            tokens = self._vocabulary()
            self._num_tokens = len(tokens)
            self._tokenizer = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Vocabulary(tokens, self._eos, self._tokenize))
            )
            from llguidance.numpy import allocate_token_bitmask

            self._bitmask = allocate_token_bitmask(1, self._tokenizer.vocab_size)
            self._tokens = tokens
            self.closing_paths = ClosingPaths(tokens)
            self._duplicate_keys = DuplicateKeyTokens(tokens)
        try:
            if structured.kind == "lark":
                grammar = llguidance.LLMatcher.grammar_from_lark(structured.grammar)
            else:
                schema = (
                    closed_objects(json.loads(structured.schema))
                    if structured.schema is not None
                    else {"type": "object"}
                )
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_FORMAT)
            matcher = llguidance.LLMatcher(self._tokenizer, grammar)
            error = matcher.get_error() if matcher.is_error() else None
        except Exception as exc:  # noqa: BLE001  (whatever llguidance raises about a schema is the client's 400)
            error = str(exc)
        if error is not None:
            what = (
                "the tools' schemas cannot be used" if structured.kind == "lark" else "the JSON schema cannot be used"
            )
            raise InvalidRequestError(f"{structured.param}: {what}: {error}", structured.param)
        state = StructuredState(
            matcher,
            structured.kind,
            self._tokens,
            self._eos,
            self.closing_paths,
            self._duplicate_keys if closes and structured.kind != "lark" else None,
            closes,
        )
        if consumed and not state.consume_tokens(list(consumed)):
            raise InvalidRequestError(
                f"{structured.param}: the answer's first {len(consumed)} tokens (a continuation) do not fit "
                f"its grammar: {matcher.get_error() or 'rejected'}",
                structured.param,
            )
        return state

    @staticmethod
    def forces(allowed) -> bool:
        """Whether a mask from allowed() leaves exactly one token (the grammar picks it, not the model)."""
        return allowed is not None and int(allowed.sum()) == 1

    def allowed(self, state: StructuredState, tokens_left: int | None = None):
        """Boolean numpy array [n_vocab]: the tokens the grammar allows next, less those that would
        repeat an object's key; with `tokens_left` (the budget: max_tokens or the context, minus the
        tokens generated), only the closing path's next token once the budget reaches it."""
        import numpy as np
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(state.matcher, self._bitmask, 0)
        bits = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")
        mask = bits[: self._num_tokens].astype(bool)
        forbidden = state.forbidden_tokens()
        if forbidden:
            kept = mask.copy()
            mask[forbidden] = False
            if not mask.any():  # never a dead end: the grammar's own mask stands
                mask = kept
        if tokens_left is not None:
            token_id = state.closing_token(tokens_left)
            if token_id is not None and mask[token_id]:
                state.closed = state.closed or int(mask.sum()) > 1  # tandem narrowed the model's choice
                mask[:] = False
                mask[token_id] = True
        return mask
