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
probabilities; a truncating sampler's support is small), which the rejection rule reads as q.
Without it the rule treats the draft as one-hot, which is still exact for any way the token was
chosen (accepted with p(x), else drawn from p without x: P(y) = q(y) p(y) + (1 - q(y)) p(y)),
only accepted less often.
"""

from __future__ import annotations

import torch


def dense_draft_probs(
    support: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...], vocab_size: int, device
) -> torch.Tensor:
    """q as the rejection rule reads it: [k, vocab] rows, zero outside each token's support."""
    rows = torch.zeros(len(support), vocab_size, dtype=torch.float32)
    for index, (ids, probs) in enumerate(support):
        rows[index, torch.tensor(ids, dtype=torch.long)] = torch.tensor(probs, dtype=torch.float32)
    return rows.to(device)
