"""What a request does to the raw logits before a token is picked (torch, the cloud tier):
logit_bias, the min_tokens mask, then the repetition (HF/vLLM), frequency and presence (OpenAI)
penalties, in vLLM's order, batched over the rows that use them. The confidence signals and
logprobs stay the model's own. local_runtime.logits_processors is the numpy twin (same maths)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sdk.protocol.engine import SamplingParams


def apply_logit_changes(logits: torch.Tensor, params: Sequence[SamplingParams],
                        histories: Sequence[tuple[Sequence[int], Sequence[int]]],
                        end_ids: Sequence[int]) -> torch.Tensor:  # fmt: skip
    """`logits` ([n_rows, vocab]) with each row's changes applied; the same tensor when no row has any."""
    rows = [row for row, p in enumerate(params) if p.changes_logits]
    if not rows:
        return logits
    out = logits.float().clone()
    device, vocab = out.device, out.shape[1]
    bias = [(row, token_id, value) for row in rows for token_id, value in params[row].logit_bias.items()]
    if bias:
        index_rows, index_ids, values = (torch.tensor(column, device=device) for column in zip(*bias))
        out.index_put_((index_rows, index_ids), values.float(), accumulate=True)
    for row in rows:
        p = params[row]
        if len(histories[row][1]) < p.min_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(end_ids))
            if banned:
                out[row, torch.tensor(banned, device=device)] = -torch.inf
    repeat_rows = [row for row in rows if params[row].repetition_penalty != 1.0]
    if repeat_rows:
        seen = _token_counts(repeat_rows, [[*histories[r][0], *histories[r][1]] for r in repeat_rows], vocab, device) > 0
        penalty = torch.tensor([params[r].repetition_penalty for r in repeat_rows], device=device)[:, None]
        selected = out[repeat_rows]
        penalized = torch.where(selected > 0, selected / penalty, selected * penalty)
        out[repeat_rows] = torch.where(seen, penalized, selected)
    counted_rows = [row for row in rows if (params[row].presence_penalty or params[row].frequency_penalty) and histories[row][1]]
    if counted_rows:
        counts = _token_counts(counted_rows, [histories[r][1] for r in counted_rows], vocab, device)
        frequency = torch.tensor([params[r].frequency_penalty for r in counted_rows], device=device)[:, None]
        presence = torch.tensor([params[r].presence_penalty for r in counted_rows], device=device)[:, None]
        out[counted_rows] -= frequency * counts + presence * (counts > 0)
    return out


def _token_counts(rows: list[int], token_lists: list[Sequence[int]], vocab: int, device) -> torch.Tensor:
    """[len(rows), vocab] float counts of each row's tokens, in one scatter over the padded lists."""
    longest = max(1, max(len(tokens) for tokens in token_lists))
    ids = torch.full((len(rows), longest), vocab, dtype=torch.long)  # padding lands in a dropped extra column
    for i, tokens in enumerate(token_lists):
        ids[i, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
    counts = torch.zeros((len(rows), vocab + 1), device=device)
    counts.scatter_add_(1, ids.to(device), torch.ones(ids.shape, device=device))
    return counts[:, :vocab]


def min_p_filter(scaled: torch.Tensor, min_p: float) -> torch.Tensor:
    """Tokens below min_p x the top token's probability set to -inf (after temperature, as vLLM)."""
    if min_p <= 0.0:
        return scaled
    threshold = scaled.max() + torch.log(torch.tensor(min_p, device=scaled.device, dtype=scaled.dtype))
    return torch.where(scaled >= threshold, scaled, torch.full_like(scaled, -torch.inf))
