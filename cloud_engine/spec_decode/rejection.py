"""Verification of a draft against the target's logits, keeping the target's distribution exactly.

Greedy requests accept the longest draft prefix equal to the target's argmax, then take the
target's argmax at the first mismatch (or after the last draft token: the bonus token), so
the output is token-for-token what decoding without a draft gives.

Sampled requests use rejection sampling (Leviathan et al. 2023; Chen et al. 2023): draft token
x_i, drawn from the draft's distribution q_i, is accepted with probability min(1, p_i(x_i) /
q_i(x_i)), where p_i is the target's distribution after the request's temperature, top-k and
top-p (cloud_engine.sampler.processed_probs). At the first rejection the emitted token is drawn
from max(0, p_i - q_i), renormalized; when all k are accepted a bonus token is drawn from
p_k. Each emitted token is then distributed exactly as p. A draft without probabilities
(n-gram lookup) is a one-hot q: accept with p_i(x_i), residual = p_i without x_i. q comes dense
from the engine's draft model ([k, vocab]) or sparse from a caller's draft (SparseDraftProbs: its
support only). The output follows p when the draft tokens were drawn from the q given; a caller's
dishonest q can bias the sampling of its own request's answer toward its drafted tokens, and nothing
else (q is read for that request's rows only). Uniforms and draws come from the request's own
generator (seeded requests stay reproducible).
"""

from __future__ import annotations

import torch

from cloud_engine.sampler import processed_probs
from cloud_engine.spec_decode.outside_drafts import SparseDraftProbs
from sdk.protocol.engine import SamplingParams


@torch.inference_mode()
def verify_draft(
    logits: torch.Tensor,
    draft: list[int],
    draft_probs: torch.Tensor | SparseDraftProbs | None,
    params: SamplingParams,
    generator: torch.Generator,
) -> list[int]:
    """`logits` [k + 1, vocab]: the target's rows at the last real token and at each draft token.
    Returns the emitted tokens: the accepted draft prefix, then one token of the target's."""
    k = len(draft)
    if params.is_greedy:
        targets = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < k and targets[accepted] == draft[accepted]:
            accepted += 1
        return [*draft[:accepted], targets[accepted]]
    emitted = []
    uniforms = torch.rand(k, generator=generator, device=logits.device).tolist() if k else []
    for i in range(k):
        p = processed_probs(logits[i], params)
        token = draft[i]
        p_token = float(p[token])
        if draft_probs is None:
            q_token = 1.0
        elif isinstance(draft_probs, SparseDraftProbs):
            q_token = draft_probs.q(i, token)
        else:
            q_token = float(draft_probs[i, token])
        if q_token > 0 and uniforms[i] < min(1.0, p_token / q_token):
            emitted.append(token)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[token] = 0.0
        elif isinstance(draft_probs, SparseDraftProbs):
            residual = draft_probs.residual(i, p)
        else:
            residual = (p - draft_probs[i].to(p.dtype)).clamp_min(0.0)
        total = float(residual.sum())
        # A rejection implies p(x) < q(x), so some of p's mass lies elsewhere; the guard is
        # for float rounding only (then the target's own distribution is the right draw).
        weights = residual / total if total > 1e-12 else p
        emitted.append(int(torch.multinomial(weights, 1, generator=generator)[0]))
        return emitted
    bonus = processed_probs(logits[k], params)
    emitted.append(int(torch.multinomial(bonus, 1, generator=generator)[0]))
    return emitted
