"""Structured answers that end valid within max_tokens: the closing path, and no repeated keys.

A grammar keeps every token valid but lets an answer run past its budget: a small model adds key
after key until max_tokens cuts the JSON, and the app gets text it cannot parse. So each
structured request carries a `StructuredState` (the llguidance matcher, a JsonScan of its text
and a closing plan), and both engines pass the tokens left (max_tokens, or the context, minus
those generated) when they ask for the mask:

- the plan is a short token sequence that takes the grammar to an accepting state from where the
  answer stands (`ClosingPaths.find`: a greedy walk over single-byte tokens that llguidance
  accepts, in an order that closes the open string, then the open containers, and fills what a
  schema still requires with its shortest values; then spelled in the vocabulary's longest pieces);
- once the plan plus the end token no longer leaves CLOSING_MARGIN tokens to spare, the mask
  allows only the plan's next token, then the end token: finish_reason "stop", stop_reason
  "closed_within_max_tokens" when tandem narrowed a choice;
- when even the plan does not fit, nothing is forced: the answer ends at "length" as before, so
  no cut answer claims to be complete.

The plan is recomputed each token near the budget and every REPLAN_EVERY tokens before (about
0.2 ms each on SmolLM2's vocabulary: bench.structured reports it). Beside it, an object never
takes a key it already has (JSON's names should be unique; a small model loops by repeating them:
"default_value" three times): the tokens that would complete one are masked (JSON constraints; a
tool grammar's schemas are closed and ordered, so llguidance already refuses a repeat there).
A request opts out of both with `close_within_max_tokens: false`: the grammar alone, as OpenAI's
and vLLM's servers.
"""

from __future__ import annotations

import collections
import string
import time

from sdk.engine_common.json_scan import DuplicateKeyTokens, JsonScan

CLOSED_WITHIN_MAX_TOKENS = "closed_within_max_tokens"  # stop_reason of an answer whose closing path was taken
CLOSING_MARGIN = 3  # tokens to spare when closing starts: one model token may lengthen the plan by this much
WATCH_TOKENS = 24  # recompute the plan every token once the budget is within this of it
REPLAN_EVERY = 8  # further away, every this many tokens
UNFIT_REPLAN_EVERY = 4  # while the plan does not fit the budget at all
MAX_BACKOFF = 64  # after walks that found no plan, at most this many tokens between walks
MAX_CLOSING_BYTES = 256  # a longer closing path is not searched for: the answer ends at length
MAX_PIECE_BYTES = 8  # the longest vocabulary piece a plan is spelled with

# The order bytes are tried in. Inside a string: close it first. Outside: close the innermost
# container, separate, then the shortest values (0, "", [], {}, null, true, false); whitespace last.
_LETTERS_DIGITS = string.ascii_lowercase + string.ascii_uppercase + string.digits
_REST = "".join(chr(c) for c in range(0x21, 0x7F))
_INSIDE_STRING = '"' + _LETTERS_DIGITS + _REST.replace("\\", "") + " "
_OUTSIDE_STRING = '}],0":[{nultrefas' + _LETTERS_DIGITS + _REST + "\n "


def _ordered(chars: str) -> bytes:
    # UTF-8 continuation bytes last: the answer may stop inside a character (a token can end
    # part-way through an emoji), and the grammar then takes nothing else until it is complete.
    return bytes(dict.fromkeys(chars.encode("ascii") + bytes(range(0x80, 0xC0))))


class ClosingPaths:
    """Per vocabulary: finds a closing plan for a matcher's state, and times each search."""

    def __init__(self, tokens: list[bytes]):
        # Short pieces only: closing text is punctuation, short values and key names.
        self._ids = {}
        for token_id, raw in enumerate(tokens):
            if 0 < len(raw) <= MAX_PIECE_BYTES:
                self._ids.setdefault(raw, token_id)
        byte_ids = {raw[0]: token_id for raw, token_id in self._ids.items() if len(raw) == 1}
        self._byte_ids = byte_ids
        self._inside = [(b, byte_ids[b]) for b in _ordered(_INSIDE_STRING) if b in byte_ids]
        self._outside = [(b, byte_ids[b]) for b in _ordered(_OUTSIDE_STRING) if b in byte_ids]
        self.seconds: collections.deque[float] = collections.deque(maxlen=100_000)  # each find(), for benches

    def find(self, matcher, scan: JsonScan) -> list[int] | None:
        """Token ids that take `matcher` from its state to an accepting one ([] when it accepts
        now), or None when the walk finds none within MAX_CLOSING_BYTES. The matcher is left as
        it was."""
        start = time.perf_counter()
        try:
            path = self._walk(matcher, scan.copy())
            if not path:
                return path if path is None else []
            return self._as_tokens(bytes(path))
        finally:
            self.seconds.append(time.perf_counter() - start)

    def _walk(self, matcher, scan: JsonScan) -> bytearray | None:
        path = bytearray()
        try:
            while not matcher.is_accepting():
                if len(path) >= MAX_CLOSING_BYTES:
                    return None
                for byte, token_id in self._inside if scan.in_string else self._outside:
                    if byte == 0x22 and scan.in_string and scan.is_key and bytes(scan.key) in scan.object_keys:
                        continue  # the plan must not repeat a key either
                    if matcher.try_consume_tokens([token_id]) == 1:
                        path.append(byte)
                        scan.push(bytes((byte,)))
                        break
                else:
                    return None
            return path
        finally:
            if path:
                matcher.rollback(len(path))

    def _as_tokens(self, text: bytes) -> list[int]:
        """The path in the vocabulary's longest pieces (fewer tokens than bytes; the grammar reads
        bytes, so any spelling of an accepted text is accepted). Greedy longest match, not the
        tokenizer: it costs a few dict lookups, the tokenizer ~0.1 ms a call."""
        ids, i = [], 0
        while i < len(text):
            for end in range(min(len(text), i + MAX_PIECE_BYTES), i, -1):
                token_id = self._ids.get(text[i:end])
                if token_id is not None:
                    ids.append(token_id)
                    i = end
                    break
        return ids


class StructuredState:
    """One structured request's grammar: its llguidance matcher, the scan of its text, its plan.

    Engines use it as they used the matcher (consume_token, consume_tokens, validate_tokens,
    rollback) and get masks from sdk.engine_common.grammar.GrammarMasks.allowed."""

    def __init__(
        self,
        matcher,
        kind: str,
        tokens: list[bytes],
        eos_token_id: int,
        paths: ClosingPaths,
        duplicate_keys: DuplicateKeyTokens | None,
        closes: bool,
    ):
        self.matcher = matcher
        self.kind = kind
        self.closes = closes  # close within the budget (the request's close_within_max_tokens)
        self.closing = False  # the budget reached the plan: every later token is the plan's
        self.closed = False  # closing narrowed at least one choice (stop_reason closed_within_max_tokens)
        self.scan = JsonScan()
        self.num_consumed = 0
        self._tokens, self._eos, self._paths, self._duplicate_keys = tokens, eos_token_id, paths, duplicate_keys
        self._plan: list[int] | None = None
        self._planned = False  # _plan is from the current state or at most _plan_age tokens ago
        self._plan_age = 0
        self._backoff = REPLAN_EVERY // 2  # tokens between walks after one found nothing (doubles)
        self._history: list[tuple] = []  # state before each recent token, for rollback (speculative drafts)

    # -- the matcher's interface ----------------------------------------------------------------

    def consume_token(self, token_id: int) -> bool:
        self._history.append(
            (
                self.scan.copy(),
                None if self._plan is None else list(self._plan),
                self._planned,
                self._plan_age,
                self.closing,
                self.closed,
            )
        )
        del self._history[:-32]
        ok = self.matcher.consume_token(token_id)
        self.scan.push(self._tokens[token_id])
        self.num_consumed += 1
        if self.closing and self._plan and self._plan[0] == token_id:
            self._plan.pop(0)
        else:
            self._plan_age += 1
            if self.closing:
                self._planned = False  # off the plan (cannot happen under the forced mask): find another
        return ok

    def consume_tokens(self, token_ids: list[int]) -> bool:
        return all(self.consume_token(t) for t in token_ids)

    def validate_tokens(self, token_ids: list[int]) -> int:
        return self.matcher.validate_tokens(token_ids)

    def rollback(self, num_tokens: int) -> bool:
        if num_tokens <= 0:
            return True
        if num_tokens > len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens (the last {len(self._history)} are kept)")
        scan, plan, planned, age, closing, closed = self._history[-num_tokens]
        del self._history[-num_tokens:]
        self.scan, self._plan, self._planned, self._plan_age, self.closing, self.closed = (
            scan,
            plan,
            planned,
            age,
            closing,
            closed,
        )
        self.num_consumed -= num_tokens
        return self.matcher.rollback(num_tokens)

    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    def is_error(self) -> bool:
        return self.matcher.is_error()

    def get_error(self):
        return self.matcher.get_error()

    # -- the rules ------------------------------------------------------------------------------

    def forbidden_tokens(self) -> list[int]:
        """Token ids that would repeat a key of the innermost object (JSON constraints only)."""
        return self._duplicate_keys.forbidden(self.scan) if self._duplicate_keys is not None else []

    def closing_token(self, tokens_left: int) -> int | None:
        """The one token the budget leaves (the plan's next, or the end token), or None when the
        model still chooses: closing is off, the budget is not yet near, or the plan cannot fit."""
        if not self.closes or (self.kind == "lark" and self.num_consumed == 0):
            return None  # a tool grammar's first token chooses between a call and plain text
        if not self.closing and tokens_left > MAX_CLOSING_BYTES + 1 + CLOSING_MARGIN:
            return None  # no plan the walk can find is that long: nothing to compute yet
        if self.closing:
            if not self._planned:
                self._replan()
            if self._plan is None:
                return None
            return self._plan[0] if self._plan else (self._eos if self.matcher.is_accepting() else None)
        if self._should_replan(tokens_left):
            self._replan()
        if self._plan is None or (not self._plan and self.kind == "lark"):
            return None  # no plan found; or plain text that may end anywhere (the model decides)
        need = len(self._plan) + 1  # then the end token
        if need > tokens_left or need + CLOSING_MARGIN < tokens_left:
            return None
        self.closing = True
        return self._plan[0] if self._plan else self._eos

    def near_budget(self, tokens_left: int) -> bool:
        """Whether closing may start within the watch window: speculative drafts stop there (each
        token of the window gets the budget's mask)."""
        plan_tokens = len(self._plan) if self._plan is not None else 0
        return self.closes and (self.closing or tokens_left <= plan_tokens + 1 + CLOSING_MARGIN + WATCH_TOKENS)

    def _should_replan(self, tokens_left: int) -> bool:
        """Each token near the budget; further away every REPLAN_EVERY tokens; a plan too long to
        fit every UNFIT_REPLAN_EVERY (it fits again only once the model closes something); after
        walks that found nothing, ever less often (each walk to MAX_CLOSING_BYTES costs ~ms)."""
        if not self._planned:
            return True
        if self._plan is None:
            return self._plan_age >= self._backoff
        need = len(self._plan) + 1
        if need > tokens_left:
            return self._plan_age >= UNFIT_REPLAN_EVERY
        return self._plan_age >= REPLAN_EVERY or (
            self._plan_age > 0 and tokens_left <= need + CLOSING_MARGIN + WATCH_TOKENS
        )

    def _replan(self) -> None:
        self._plan = self._paths.find(self.matcher, self.scan)
        self._planned, self._plan_age = True, 0
        self._backoff = REPLAN_EVERY if self._plan is not None else min(2 * self._backoff, MAX_BACKOFF)
