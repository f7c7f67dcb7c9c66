"""A draft another model made for a request an engine is generating (the device's model drafting
for the cloud's, issue 56): what the caller sends and the verifying engine takes
(cloud_engine.spec_decode.outside_drafts verifies it; tandem.v1's GenerateWithDrafts carries it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

PROBABILITY_SLACK = 1e-3  # a support's probabilities may sum this far past 1 (float rounding on the device)


@dataclass(frozen=True)
class OutsideDraft:
    request_id: str
    start: int  # the request's output tokens this draft follows
    token_ids: tuple[int, ...]
    # Per draft token: (token ids, probabilities) of the distribution it was drawn from; None: one-hot.
    support: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...] | None = None

    def check(self, vocab_size: int) -> None:
        """ValueError naming what is wrong with a draft that can never be verified."""
        if self.start < 0:
            raise ValueError(f"a draft's start must be >= 0, got {self.start}")
        if not self.token_ids:
            raise ValueError("a draft needs at least one token")
        for token in self.token_ids:
            if not 0 <= token < vocab_size:
                raise ValueError(f"draft token {token} is outside the vocabulary (0..{vocab_size - 1})")
        if self.support is None:
            return
        if len(self.support) != len(self.token_ids):
            raise ValueError(f"a draft of {len(self.token_ids)} tokens needs as many supports, got {len(self.support)}")
        for index, (token, (ids, probs)) in enumerate(zip(self.token_ids, self.support)):
            if len(ids) != len(probs) or not ids:
                raise ValueError(f"support[{index}] needs as many probabilities as token ids, and at least one")
            if any(not 0 <= i < vocab_size for i in ids) or len(set(ids)) != len(ids):
                raise ValueError(f"support[{index}] has a token id outside the vocabulary, or one twice")
            if any(not (math.isfinite(p) and 0.0 <= p <= 1.0) for p in probs):
                raise ValueError(f"support[{index}] has a probability outside [0, 1]")
            if sum(probs) > 1.0 + PROBABILITY_SLACK:
                raise ValueError(f"support[{index}]'s probabilities sum to {sum(probs):.6f} > 1")
            if token not in ids or probs[ids.index(token)] <= 0.0:
                raise ValueError(f"draft token {index} ({token}) has no probability in its own support")
