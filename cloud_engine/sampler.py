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
from sdk.engine_common.token_events import SampledToken

# Nucleus candidates are looked for among this many most likely tokens first, then among the
# wider window for the rows whose nucleus did not fit, then in a full sort. Each is one
# batched top-k over the rows still open: a flat distribution (penalties flatten them) costs
# one more batched call, not a chain of per-row ones (bench.engine_throughput's penalty key).
_NUCLEUS_WINDOWS = (256, 4096)


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A request's own RNG: seeded when the request gave a seed, from OS entropy otherwise."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


@torch.inference_mode()
def sample_batch(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
    end_ids: Sequence[int] = (),
    allowed: Sequence[torch.Tensor | None] | None = None,
) -> list[SampledToken]:
    """Pick one token per row of `logits` ([n_rows, vocab] float32) and measure its row's signals.

    `histories`: each row's (prompt ids, output ids) and `end_ids`: the end-of-generation ids,
    read only for rows whose params change the logits (penalties, logit_bias, min_tokens).
    `allowed`: per row, None or the boolean mask of a structured request's grammar (the pick only)."""
    logits = logits.float()
    greedy = [p.is_greedy for p in params]  # raises for params the engine did not resolve
    changed = apply_logit_changes(
        logits, params, histories or [], end_ids
    )  # a copy when any row changes (structured rows do)
    for row, mask in enumerate(allowed or ()):
        if mask is not None:
            changed[row].masked_fill_(~mask, -torch.inf)
    token_ids = changed.argmax(dim=-1)
    sampled_rows = [row for row in range(len(params)) if not greedy[row]]
    if sampled_rows:
        token_ids[sampled_rows] = _sample_rows(
            changed, [params[r] for r in sampled_rows], [generators[r] for r in sampled_rows], sampled_rows
        )
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


def _sample_rows(
    changed: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator], rows: list[int]
) -> torch.Tensor:
    """One token id per row in `rows` of `changed` ([n, vocab], logit changes applied): temperature,
    then min-p, top-k, top-p (exact), drawn from each row's own generator. The nucleus of every
    top-p-only row (the common case) is found for all of them at once."""
    temperatures = torch.tensor([[p.temperature] for p in params], device=changed.device, dtype=changed.dtype)
    scaled = changed[torch.tensor(rows, device=changed.device)] / temperatures  # one [rows, vocab] op, not one per row
    for i, p in enumerate(params):
        if p.min_p > 0.0:
            scaled[i] = min_p_filter(scaled[i], p.min_p)
    nucleus_only = [i for i, p in enumerate(params) if p.top_k <= 0 and p.top_p < 1.0]
    candidates: list[torch.Tensor | None] = [None] * len(rows)
    if nucleus_only:
        subset = scaled if len(nucleus_only) == len(rows) else scaled[torch.tensor(nucleus_only, device=scaled.device)]
        for i, ids in zip(nucleus_only, nucleus_ids(subset, [params[i].top_p for i in nucleus_only])):
            candidates[i] = ids
    picked = []
    for i, p in enumerate(params):
        ids = candidates[i] if candidates[i] is not None else _truncate(scaled[i], p.top_k, p.top_p)
        if ids is None:
            picked.append(torch.multinomial(torch.softmax(scaled[i], dim=-1), 1, generator=generators[i])[0])
        else:
            weights = torch.softmax(scaled[i][ids], dim=-1)
            picked.append(ids[torch.multinomial(weights, 1, generator=generators[i])[0]])
    return torch.stack(picked)


def _truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """Token ids kept by top-k then top-p, most likely first; None when nothing is cut."""
    vocab = scaled.shape[0]
    if top_k <= 0 and top_p >= 1.0:
        return None
    if top_k > 0:
        values, ids = scaled.topk(min(top_k, vocab))
        if top_p >= 1.0:
            return ids
        # top-p over the renormalised top-k: positions in its (already sorted) values.
        return ids[nucleus_ids(values[None], [top_p])[0]]
    return nucleus_ids(scaled[None], [top_p])[0]


def nucleus_ids(
    scaled: torch.Tensor, top_ps: Sequence[float], windows: Sequence[int] = _NUCLEUS_WINDOWS
) -> list[torch.Tensor]:
    """For each row of `scaled` ([n, vocab]), the ids of the shortest most-likely-first head whose
    probability mass reaches its top_p (the whole vocabulary if it never does). Rows are looked at
    in `windows` of the most likely tokens, one batched top-k per window for the rows still open,
    then a full sort; the mass of a head does not depend on the window it was found in."""
    num_rows, vocab = scaled.shape
    log_z = torch.logsumexp(scaled, dim=-1)
    found: list[torch.Tensor | None] = [None] * num_rows
    open_rows = list(range(num_rows))
    for window in (*[w for w in windows if w < vocab], vocab):
        index = torch.tensor(open_rows, device=scaled.device)
        values, ids = (scaled if len(open_rows) == num_rows else scaled[index]).topk(window, dim=-1)
        mass = torch.cumsum(torch.exp(values - log_z[index, None]), dim=-1)
        targets = torch.tensor([[top_ps[r]] for r in open_rows], device=mass.device, dtype=mass.dtype)
        num_kept = (torch.searchsorted(mass, targets)[:, 0] + 1).tolist()
        still_open = []
        for i, row in enumerate(open_rows):
            if num_kept[i] <= window or window == vocab:  # the head reached top_p inside this window
                found[row] = ids[i, : min(num_kept[i], window)]
            else:
                still_open.append(row)
        open_rows = still_open
        if not open_rows:
            break
    return found  # type: ignore[return-value]


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
