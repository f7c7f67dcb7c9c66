"""Per-token confidence signals, read off the token events an engine streams.

Both engines measure logprob, entropy and margin on the model's own distribution
(temperature 1, before truncation), so the signals mean the same thing whatever
sampling settings a request used. This module only reshapes them: one
`TokenSignals` per event, or numpy arrays over a whole generation for the
sequence aggregators in `confidence.aggregate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from sdk.protocol.engine import TokenEvent


@dataclass(frozen=True)
class TokenSignals:
    """What one generated token tells us about the model's certainty."""

    logprob: float  # log-probability of the chosen token (<= 0)
    prob: float  # probability of the chosen token, exp(logprob), in [0, 1]
    entropy: float  # entropy (nats) of the model's distribution at this position
    margin: float  # top-1 minus top-2 probability
    topk_mass: float  # summed probability of the alternatives the event carries; NaN when it carries none
    token_id: int = -1  # the chosen token (the repetition feature reads the ids); -1 when unknown


def token_signals(event: TokenEvent) -> TokenSignals:
    """The signals of one token event."""
    # Engines compute logprob as (logit - log Z) in finite precision; a top token can
    # come out a rounding error above 0, which would make prob > 1 and break bounds.
    logprob = min(float(event.logprob), 0.0)
    if event.top_logprobs:
        # fsum: up to 20 terms of very different sizes; clamp for the same rounding reason.
        topk_mass = min(math.fsum(math.exp(alt.logprob) for alt in event.top_logprobs), 1.0)
    else:
        topk_mass = math.nan
    return TokenSignals(
        logprob=logprob,
        prob=math.exp(logprob),
        entropy=float(event.entropy),
        margin=float(event.margin),
        topk_mass=topk_mass,
        token_id=int(event.token_id),
    )


@dataclass(frozen=True)
class SignalArrays:
    """Signals of a whole generation: float64 arrays, one entry per generated token, in order."""

    logprob: np.ndarray  # chosen-token log-probabilities
    prob: np.ndarray  # chosen-token probabilities
    entropy: np.ndarray  # per-position entropies (nats)
    margin: np.ndarray  # per-position top-1 minus top-2 probabilities
    topk_mass: np.ndarray  # per-position top-k alternative mass (NaN where none was carried)
    token_ids: np.ndarray | None = None  # int64 chosen token ids; None when unknown (no repetition feature)

    def __len__(self) -> int:
        return int(self.prob.shape[0])

    @property
    def num_tokens(self) -> int:
        return len(self)

    def head(self, num_tokens: int) -> SignalArrays:
        """The first `num_tokens` tokens (all of them when there are fewer)."""
        return SignalArrays(
            logprob=self.logprob[:num_tokens],
            prob=self.prob[:num_tokens],
            entropy=self.entropy[:num_tokens],
            margin=self.margin[:num_tokens],
            topk_mass=self.topk_mass[:num_tokens],
            token_ids=None if self.token_ids is None else self.token_ids[:num_tokens],
        )

    @classmethod
    def from_token_signals(cls, signals: Iterable[TokenSignals]) -> SignalArrays:
        """Stack per-token signals into arrays (an empty input gives empty arrays)."""
        rows = list(signals)

        def column(name: str) -> np.ndarray:
            return np.fromiter((getattr(row, name) for row in rows), dtype=np.float64, count=len(rows))

        return cls(
            logprob=column("logprob"),
            prob=column("prob"),
            entropy=column("entropy"),
            margin=column("margin"),
            topk_mass=column("topk_mass"),
            token_ids=np.fromiter((row.token_id for row in rows), dtype=np.int64, count=len(rows)),
        )


def signals_from_events(events: Iterable[TokenEvent]) -> SignalArrays:
    """Signals of a generation's events, one row per event, skipping nothing."""
    return SignalArrays.from_token_signals(token_signals(event) for event in events)
