"""Spotting an answer that has fallen into a loop, token by token (stdlib only).

A small model at low temperature that loses the thread repeats itself exactly ("The
answer is 4. The answer is 4. ...") until max_tokens. `RepetitionTracker` follows one
generation's tokens and keeps two measures, each O(MAX_PERIOD) or O(1) per token:

- the *loop*: the longest tail of the output that is one unit of at most MAX_PERIOD
  tokens repeated exactly (its period and the tokens it spans). `LoopRule`s read it: the
  cascade escalates a looping local answer at ESCALATE_LOOP, and an engine stops one at
  STOP_LOOP (finish_reason "length", stop_reason "repetition"). Exact repetition keeps
  legitimate structure out: a numbered list, a table or a worked sum changes from one
  line to the next.
- `repeated_ngram_fraction`: of the NGRAM-token n-grams inside the last NGRAM_WINDOW
  tokens, the share that duplicate another one there (0 when all differ, towards 1 in a
  tight loop): a soft signal, one of the confidence features probes can learn from.

The engines import this module (it is part of the contract: both tiers stop at the same
place); `confidence` computes the same n-gram fraction over a whole answer with
`repeated_ngram_fraction`, so the batch and running features agree exactly.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Sequence

MAX_PERIOD = 64  # longest repeating unit looked for, in tokens (a sentence or two)
NGRAM = 4  # tokens per n-gram of the soft signal
NGRAM_WINDOW = 64  # tokens the soft signal looks back over


@dataclass(frozen=True)
class LoopRule:
    """When a periodic tail counts as a loop: it spans at least `min_span` tokens and repeats
    its unit at least `min_repeats` times (the larger of the two bars applies)."""

    min_span: int
    min_repeats: int

    def __post_init__(self) -> None:
        if self.min_repeats < 2 or self.min_span < 2:
            raise ValueError(f"a loop repeats its unit at least twice over at least 2 tokens, got {self}")

    def required_span(self, period: int) -> int:
        return max(self.min_span, self.min_repeats * period)


# Chosen on real answers (bench.loop_stop): over 1,972 right GSM8K solutions by GPT-4 and
# Mixtral, replayed in SmolLM2's vocabulary, neither rule fires; the escalation rule fires on
# none of them down to (24, 2) (at (16, 2) it fired on 3), so the stop sits well above that.
STOP_LOOP = LoopRule(min_span=64, min_repeats=3)
# Lower: escalating costs a cloud call, never the user's answer, so the cascade acts first.
ESCALATE_LOOP = LoopRule(min_span=24, min_repeats=2)


@dataclass(frozen=True)
class Loop:
    period: int  # tokens in the repeating unit
    span: int  # tokens of the output's tail the repetition covers (>= 2 x period)


class RepetitionTracker:
    """The loop and n-gram measures of one generation; `push` every output token in order."""

    def __init__(self) -> None:
        self._recent: deque[int] = deque(maxlen=max(MAX_PERIOD, NGRAM_WINDOW))
        # _runs[p]: how many of the latest tokens each equal the token p places before them.
        self._runs = [0] * (MAX_PERIOD + 1)
        self._grams: deque[tuple[int, ...]] = deque()  # n-grams ending inside the window, oldest first
        self._gram_counts: Counter[tuple[int, ...]] = Counter()
        self.num_tokens = 0

    def push(self, token_id: int) -> None:
        recent, runs = self._recent, self._runs
        num_recent = len(recent)
        for period in range(1, MAX_PERIOD + 1):
            runs[period] = runs[period] + 1 if period <= num_recent and recent[-period] == token_id else 0
        recent.append(token_id)
        self.num_tokens += 1
        if len(recent) >= NGRAM:
            gram = tuple(recent[i] for i in range(-NGRAM, 0))
            self._grams.append(gram)
            self._gram_counts[gram] += 1
            if len(self._grams) > NGRAM_WINDOW - NGRAM + 1:
                old = self._grams.popleft()
                self._gram_counts[old] -= 1
                if not self._gram_counts[old]:
                    del self._gram_counts[old]

    def loop(self, rule: LoopRule) -> Loop | None:
        """The shortest-period loop the output's tail satisfies `rule` with, or None."""
        for period in range(1, MAX_PERIOD + 1):
            span = self._runs[period] + period  # the run plus the unit it copies
            if self._runs[period] >= period and span >= rule.required_span(period):
                return Loop(period, span)
        return None

    @property
    def repeated_ngram_fraction(self) -> float:
        """Share of the window's n-grams that duplicate another there; 0.0 before the first n-gram."""
        if not self._grams:
            return 0.0
        return 1.0 - len(self._gram_counts) / len(self._grams)


def repeated_ngram_fraction(token_ids: Sequence[int]) -> float:
    """`RepetitionTracker.repeated_ngram_fraction` after all of `token_ids`, in one pass."""
    window = list(token_ids[-NGRAM_WINDOW:])
    grams = [tuple(window[i : i + NGRAM]) for i in range(len(window) - NGRAM + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def find_loop(token_ids: Sequence[int], rule: LoopRule) -> tuple[int, Loop] | None:
    """The first position at which `rule` would have stopped `token_ids` (tokens kept, the loop),
    or None: what a tracker fed the tokens one by one reports (bench.loop_stop replays answers)."""
    tracker = RepetitionTracker()
    for index, token_id in enumerate(token_ids):
        tracker.push(token_id)
        found = tracker.loop(rule)
        if found is not None:
            return index + 1, found
    return None
