"""The cloud engine's sampler: one batched pass over the logits of every request that samples this step.

Confidence signals (logprob, entropy, top-1/top-2 margin, top alternatives) are computed
on the model's own distribution (temperature 1, before truncation), exactly as the local
runtime's sampler does, so the router reads the same quantities from either tier. The
token is then picked from the logits after the request's bias, masks and penalties
(cloud_engine.logits_processors) with its temperature, min-p, top-k and top-p, from the
request's own `torch.Generator` (reproducible per seed). Work stays on the logits' device; only
the chosen ids and the signals cross to the host, in one transfer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cloud_engine.logits_processors import apply_logit_changes, min_p_filter
from sdk.protocol.engine import SamplingParams
from sdk.protocol.token_events import SampledToken

# Nucleus candidates are looked for among this many most likely tokens first; a row
# whose nucleus is wider (a very flat distribution) falls back to a full sort.
_NUCLEUS_WINDOW = 64


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A request's own RNG: seeded when the request gave a seed, from OS entropy otherwise."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


@torch.inference_mode()
def sample_batch(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
                 histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
                 end_ids: Sequence[int] = ()) -> list[SampledToken]:  # fmt: skip
    """Pick one token per row of `logits` ([n_rows, vocab] float32) and measure its row's signals.

    `histories`: each row's (prompt ids, output ids) and `end_ids`: the end-of-generation ids,
    read only for rows whose params change the logits (penalties, logit_bias, min_tokens)."""
    logits = logits.float()
    greedy = [p.is_greedy for p in params]  # raises for params the engine did not resolve
    changed = apply_logit_changes(logits, params, histories or [], end_ids)
    token_ids = changed.argmax(dim=-1)
    sampled_rows = [row for row in range(len(params)) if not greedy[row]]
    if sampled_rows:
        picked = [_sample_row(changed[row], params[row], generators[row]) for row in sampled_rows]
        token_ids[sampled_rows] = torch.stack(picked)
    return token_signals(logits, token_ids, params)


@torch.inference_mode()
def token_signals(logits: torch.Tensor, token_ids: torch.Tensor, params: list[SamplingParams]) -> list[SampledToken]:
    """The SampledToken of each row for its chosen token id (sample_batch's picks, or the
    tokens a speculative verification emitted, read off the target's rows)."""
    logits = logits.float()
    # Few full-vocabulary passes (this runs every step for every row): log Z once, then
    # probabilities, entropy = log Z - sum(p * logit) (0 * -inf terms dropped by nansum),
    # and the top-2 margin from the top-2 logits.
    log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - log_z[:, None])
    entropies = (log_z - torch.nansum(probs * logits, dim=-1)).clamp_min(0.0)
    top2 = torch.exp(logits.topk(min(2, logits.shape[-1]), dim=-1).values - log_z[:, None])
    margins = top2[:, 0] - top2[:, 1] if top2.shape[1] > 1 else top2[:, 0]
    rows = torch.arange(logits.shape[0], device=logits.device)
    chosen_logprobs = logits[rows, token_ids] - log_z
    max_k = max((p.logprobs or 0) for p in params)
    top = logits.topk(max_k, dim=-1) if max_k else None
    # One device-to-host transfer for everything the events need.
    host = torch.stack([token_ids.to(logits.dtype), chosen_logprobs, entropies, margins]).cpu().tolist()
    top_ids = top.indices.cpu().tolist() if top is not None else None
    top_values = (top.values - log_z[:, None]).cpu().tolist() if top is not None else None
    results = []
    for row, p in enumerate(params):
        k = p.logprobs or 0
        results.append(
            SampledToken(
                token_id=int(host[0][row]),
                logprob=host[1][row],
                entropy=host[2][row],
                margin=host[3][row],
                top_ids=top_ids[row][:k] if k else [],
                top_logprobs=top_values[row][:k] if k else [],
            )
        )
    return results


def _sample_row(row_logits: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Sample one token id (0-d tensor) with temperature, then min-p, top-k, top-p (exact)."""
    scaled = min_p_filter(row_logits.float() / p.temperature, p.min_p)
    candidate_ids = _truncate(scaled, p.top_k, p.top_p)
    if candidate_ids is None:
        weights = torch.softmax(scaled, dim=-1)
        return torch.multinomial(weights, 1, generator=generator)[0]
    weights = torch.softmax(scaled[candidate_ids], dim=-1)
    return candidate_ids[torch.multinomial(weights, 1, generator=generator)[0]]


def _truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """Token ids kept by top-k then top-p, most likely first; None when nothing is cut."""
    vocab = scaled.shape[0]
    if top_k <= 0 and top_p >= 1.0:
        return None
    if top_k > 0:
        values, ids = scaled.topk(min(top_k, vocab))
        if top_p >= 1.0:
            return ids
        return _nucleus(values, ids, torch.logsumexp(values, dim=0), top_p)  # top-p over the renormalised top-k
    log_z = torch.logsumexp(scaled, dim=0)
    window = min(_NUCLEUS_WINDOW, vocab)
    while True:
        values, ids = scaled.topk(window)
        kept = _nucleus(values, ids, log_z, top_p)
        if kept.shape[0] < window or window == vocab:
            return kept
        window = min(window * 4, vocab)


def _nucleus(sorted_values: torch.Tensor, sorted_ids: torch.Tensor, log_z: torch.Tensor, top_p: float) -> torch.Tensor:
    """The shortest head of `sorted_ids` whose probability mass reaches top_p (all of them if it never does)."""
    mass = torch.cumsum(torch.exp(sorted_values - log_z), dim=0)
    num_kept = int(torch.searchsorted(mass, torch.tensor([top_p], device=mass.device, dtype=mass.dtype))[0]) + 1
    return sorted_ids[: min(num_kept, sorted_ids.shape[0])]


def processed_probs(row_logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The full-vocabulary distribution `_sample_row` draws from: temperature, then top-k, then
    top-p, renormalized (zeros outside the kept set). Speculative verification compares the
    target's and the draft's versions of it."""
    scaled = min_p_filter(row_logits.float() / p.temperature, p.min_p)
    candidate_ids = _truncate(scaled, p.top_k, p.top_p)
    if candidate_ids is None:
        return torch.softmax(scaled, dim=-1)
    probs = torch.zeros_like(scaled)
    probs[candidate_ids] = torch.softmax(scaled[candidate_ids], dim=-1)
    return probs
