"""Drafts made outside the engine: another model (the device's, in the cascade) drafts the next
tokens of a request the engine is decoding, and the engine verifies them in its next step exactly
as it verifies its own proposer's (cloud_engine.spec_decode.rejection), so the answer stays the
engine's own: greedy token for token, sampled in distribution.

A draft says where it starts: the number of the request's output tokens the drafter had seen.
The engine may have emitted more since (the draft was in flight during a step): the draft's
first tokens must then equal what was emitted, and only the rest is verified; a draft that
disagrees with them, or lies wholly in the past, is dropped. The engine never waits for a draft:
a request without one decodes one token a step, as ever.

A draft token comes with the distribution it was sampled from (`support`: token ids and their
probabilities; a truncating sampler's support is small), which the rejection rule reads as q. It
stays sparse end to end (`SparseDraftProbs`): a draft costs its support's size, never a row of the
vocabulary per token; the rule makes one vocabulary-wide row, its residual, at the first rejection.
Without it the rule treats the draft as one-hot, which is still exact for any way the token was
chosen (accepted with p(x), else drawn from p without x: P(y) = q(y) p(y) + (1 - q(y)) p(y)),
only accepted less often.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Support = tuple[tuple[int, ...], tuple[float, ...]]  # one draft token's (token ids, probabilities)


@dataclass(frozen=True)
class SparseDraftProbs:
    """q as the rejection rule reads it, per draft token on its support only (zero elsewhere)."""

    supports: tuple[Support, ...]

    def __len__(self) -> int:
        return len(self.supports)

    def __getitem__(self, index: slice) -> SparseDraftProbs:
        return SparseDraftProbs(self.supports[index])

    def q(self, position: int, token: int) -> float:
        """q(token) at draft position `position`."""
        ids, probs = self.supports[position]
        return probs[ids.index(token)] if token in ids else 0.0

    def residual(self, position: int, p: torch.Tensor) -> torch.Tensor:
        """max(0, p - q) at draft position `position`: p less q on q's support only."""
        ids, probs = self.supports[position]
        residual = p.clone()
        residual[torch.tensor(ids, dtype=torch.long, device=p.device)] -= torch.tensor(
            probs, dtype=p.dtype, device=p.device
        )
        return residual.clamp_min_(0.0)
