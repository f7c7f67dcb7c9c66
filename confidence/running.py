"""Confidence tracked token by token, for routing decisions during generation.

The router cannot wait for the whole answer to decide whether to escalate, and must
not re-aggregate the whole prefix on every token. `RunningConfidence` keeps running
sums, minimums and maximums (O(1) per token), the last `window` probabilities
(O(window) per token: the current window's mean is re-summed instead of updated by
add/subtract, so rounding errors do not drift over long answers), and all
probabilities in sorted order for the quantiles (a bisect insert: O(log n) compares
plus an O(n) memmove, then O(1) per quantile).

After n tokens its features equal `sequence_features` of those n tokens, up to
floating-point summation order (numpy sums pairwise, we sum left to right).
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

from confidence.aggregate import (
    DEFAULT_WINDOW,
    FEATURE_NAMES,
    QUANTILE_FEATURE_NAMES,
    QUANTILE_LEVELS,
    empty_features,
    pack_features,
    quantile_of_sorted,
    validate_window,
)
from confidence.signals import TokenSignals, token_signals
from sdk.protocol.engine import TokenEvent
from sdk.engine_common.repetition import RepetitionTracker


class RunningConfidence:
    """Incremental sequence features of one generation; feed it every token in order."""

    def __init__(self, window: int = DEFAULT_WINDOW):
        validate_window(window)
        self.window = window  # tokens per sliding window, as in sequence_features
        self._num_tokens = 0
        self._sum_logprob = 0.0
        self._sum_prob = 0.0
        self._sum_entropy = 0.0
        self._sum_margin = 0.0
        self._sum_topk_mass = 0.0
        self._num_topk_mass = 0  # tokens that carried alternatives
        self._max_entropy = -math.inf
        self._min_margin = math.inf
        self._sorted_probs: list[float] = []  # min_prob is its first entry
        self._recent_probs: deque[float] = deque(maxlen=window)
        self._window_mean_prob = math.nan
        self._min_full_window_mean_prob = math.inf  # over windows of exactly `window` tokens
        self.repetition = RepetitionTracker()  # loops and the repeated-n-gram feature (token ids; -1 = unknown)
        self._token_ids_known = True
        self.num_forced = 0  # tokens a grammar forced (TokenEvent.forced): seen, not judged

    @property
    def num_tokens(self) -> int:
        """Tokens judged so far (every token a grammar did not force)."""
        return self._num_tokens

    @property
    def num_seen(self) -> int:
        """Every token of the answer so far, forced ones included."""
        return self._num_tokens + self.num_forced

    def update(self, event: TokenEvent) -> None:
        """Take in the next generated token. A token the request's grammar forced is counted but not
        judged: the mask chose it, so its probability says nothing of the model's confidence."""
        if event.forced:
            self.num_forced += 1
            return
        self.update_signals(token_signals(event))

    def update_signals(self, signals: TokenSignals) -> None:
        """Take in the next token's signals (when they were extracted elsewhere)."""
        self._num_tokens += 1
        self._sum_logprob += signals.logprob
        self._sum_prob += signals.prob
        self._sum_entropy += signals.entropy
        self._sum_margin += signals.margin
        if not math.isnan(signals.topk_mass):
            self._sum_topk_mass += signals.topk_mass
            self._num_topk_mass += 1
        self._max_entropy = max(self._max_entropy, signals.entropy)
        self._min_margin = min(self._min_margin, signals.margin)
        bisect.insort(self._sorted_probs, signals.prob)
        self._recent_probs.append(signals.prob)
        self._window_mean_prob = sum(self._recent_probs) / len(self._recent_probs)
        if len(self._recent_probs) == self.window:
            self._min_full_window_mean_prob = min(self._min_full_window_mean_prob, self._window_mean_prob)
        self._token_ids_known = self._token_ids_known and signals.token_id >= 0
        self.repetition.push(signals.token_id)

    def features_dict(self) -> dict[str, float]:
        """Features of the tokens seen so far, by name (see confidence.aggregate.FEATURE_NAMES)."""
        n = self._num_tokens
        if n == 0:
            return empty_features()
        # Until the first full window exists, the whole prefix is the only window.
        window_min = self._window_mean_prob if n < self.window else self._min_full_window_mean_prob
        values = {
            "num_tokens": float(n),
            "mean_logprob": self._sum_logprob / n,
            "mean_prob": self._sum_prob / n,
            "min_prob": self._sorted_probs[0],
            "mean_entropy": self._sum_entropy / n,
            "max_entropy": self._max_entropy,
            "mean_margin": self._sum_margin / n,
            "min_margin": self._min_margin,
            "window_min_mean_prob": window_min,
            "window_mean_prob": self._window_mean_prob,
            "mean_topk_mass": self._sum_topk_mass / self._num_topk_mass if self._num_topk_mass else math.nan,
            "repeated_ngram_fraction": self.repetition.repeated_ngram_fraction if self._token_ids_known else math.nan,
        }
        for name, q in zip(QUANTILE_FEATURE_NAMES, QUANTILE_LEVELS):
            values[name] = quantile_of_sorted(self._sorted_probs, q)
        return values

    def features(self) -> np.ndarray:
        """Features of the tokens seen so far, float64 in FEATURE_NAMES order."""
        return pack_features(self.features_dict())

    def score(self, kind: str = "mean_prob") -> float:
        """One feature of the tokens seen so far (any FEATURE_NAMES entry); NaN before the first token."""
        if kind not in FEATURE_NAMES:
            raise ValueError(f"unknown confidence score {kind!r}; choose one of {', '.join(FEATURE_NAMES)}")
        return float(self.features_dict()[kind])
