"""What a request does to the raw logits before a token is picked (torch, the cloud tier):
logit_bias, the min_tokens mask, then the repetition (HF/vLLM), frequency and presence (OpenAI)
penalties, in vLLM's order, batched over the rows that use them. The confidence signals and
logprobs stay the model's own. local_runtime.logits_processors is the numpy twin (same maths)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch

from sdk.protocol.engine import SamplingParams


def apply_logit_changes(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[tuple[Sequence[int], Sequence[int]]],
    end_ids: Sequence[int],
) -> torch.Tensor:
    """`logits` ([n_rows, vocab]) with each row's changes applied; the same tensor when no row has any.

    Sparse over the tokens each row has seen (a few hundred of ~50k): one gather/scatter per kind
    of change for the whole batch, never a dense [rows, vocab] count table (that cost a B=32 batch
    ~20% of its throughput)."""
    rows = [row for row, p in enumerate(params) if p.changes_logits]
    if not rows:
        return logits
    out = logits.float().clone()
    device = out.device
    bias = [(row, token_id, value) for row in rows for token_id, value in params[row].logit_bias.items()]
    if bias:
        bias_rows, bias_ids, values = zip(*bias)
        out.index_put_(_indices(bias_rows, bias_ids, device), torch.tensor(values, device=device), accumulate=True)
    masked = [
        (row, token_id)
        for row in rows
        if len(histories[row][1]) < params[row].min_tokens
        for token_id in (*params[row].stop_token_ids, *(() if params[row].ignore_eos else end_ids))
    ]
    if masked:
        out.index_put_(_indices(*zip(*masked), device), torch.tensor(-torch.inf, device=device))
    repeat_rows = [row for row in rows if params[row].repetition_penalty != 1.0]
    if repeat_rows:
        # index_put_ / a flat gather: indexing with a tuple (out[rows, ids] = ...) was ~100x slower on CPU
        seen_rows, seen_ids = _unique_pairs(
            repeat_rows, [[*histories[r][0], *histories[r][1]] for r in repeat_rows], out.shape[1]
        )
        penalty = torch.tensor([params[r].repetition_penalty for r in range(len(params))], device=device)[
            seen_rows.to(device)
        ]
        index = (seen_rows.to(device), seen_ids.to(device))
        values = out.view(-1)[index[0] * out.shape[1] + index[1]]
        out.index_put_(index, torch.where(values > 0, values / penalty, values * penalty))
    counted_rows = [
        row for row in rows if (params[row].presence_penalty or params[row].frequency_penalty) and histories[row][1]
    ]
    if counted_rows:
        frequency = torch.tensor([params[r].frequency_penalty or 0.0 for r in range(len(params))], device=device)
        presence = torch.tensor([params[r].presence_penalty or 0.0 for r in range(len(params))], device=device)
        outputs = [histories[r][1] for r in counted_rows]
        every_rows, every_ids = _flat_pairs(counted_rows, outputs)
        # frequency once per occurrence (accumulated), presence once per distinct token
        out.index_put_(
            (every_rows.to(device), every_ids.to(device)), -frequency[every_rows.to(device)], accumulate=True
        )
        seen_rows, seen_ids = _unique_pairs(counted_rows, outputs, out.shape[1])
        out.index_put_((seen_rows.to(device), seen_ids.to(device)), -presence[seen_rows.to(device)], accumulate=True)
    return out


def _indices(rows: Sequence[int], ids: Sequence[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(rows, device=device), torch.tensor(ids, device=device)


def _flat_pairs(rows: list[int], token_lists: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token id) of every token of every row, as two index tensors (on the CPU). Built with
    numpy: torch.tensor() over Python lists was most of this module's cost."""
    lengths = [len(tokens) for tokens in token_lists]
    token_ids = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=sum(lengths))
    return torch.from_numpy(np.repeat(np.asarray(rows, dtype=np.int64), lengths)), torch.from_numpy(token_ids)


def _unique_pairs(rows: list[int], token_lists: list[Sequence[int]], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct (row, token id) pairs of each row's tokens, as two index tensors (on the CPU)."""
    row_index, token_ids = _flat_pairs(rows, token_lists)
    keys = torch.unique(row_index * vocab + token_ids)
    return keys // vocab, keys % vocab


def min_p_filter(scaled: torch.Tensor, min_p: float) -> torch.Tensor:
    """Tokens below min_p x the top token's probability set to -inf (after temperature, as vLLM)."""
    if min_p <= 0.0:
        return scaled
    threshold = scaled.max() + torch.log(torch.tensor(min_p, device=scaled.device, dtype=scaled.dtype))
    return torch.where(scaled >= threshold, scaled, torch.full_like(scaled, -torch.inf))
