"""What a request does to the raw logits before a token is picked (numpy, the local tier):
logit_bias, the min_tokens mask, then the repetition (HF/vLLM), frequency and presence (OpenAI)
penalties, in vLLM's order. The confidence signals and logprobs stay the model's own: these
change only which token is picked. cloud_engine.logits_processors is the torch twin (same maths)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sdk.protocol.engine import SamplingParams


def apply_logit_changes(
    row_logits: np.ndarray, p: SamplingParams, prompt_ids: Sequence[int], output_ids: Sequence[int], end_ids: np.ndarray
) -> np.ndarray:
    """A float64 copy of one row of logits with the request's changes applied (p.changes_logits)."""
    row = row_logits.astype(np.float64)
    if p.logit_bias:
        ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
        row[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float64, count=len(p.logit_bias))
    if len(output_ids) < p.min_tokens:
        if not p.ignore_eos:  # under ignore_eos the end tokens do not end anything
            row[end_ids] = -np.inf
        if p.stop_token_ids:
            row[np.asarray(p.stop_token_ids, dtype=np.int64)] = -np.inf
    if p.repetition_penalty != 1.0:
        seen = np.unique(np.asarray([*prompt_ids, *output_ids], dtype=np.int64))
        values = row[seen]
        row[seen] = np.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and len(output_ids):
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        row[ids] -= p.frequency_penalty * counts + p.presence_penalty
    return row


def min_p_candidates(scaled: np.ndarray, min_p: float) -> np.ndarray:
    """Ids of the tokens at or above min_p x the top token's probability (after temperature, as
    vLLM), most likely first. Returned as ids rather than a -inf mask: argpartition over a row
    that is mostly -inf took ~6 ms."""
    ids = np.flatnonzero(scaled >= scaled.max() + np.log(min_p))
    return ids[np.argsort(-scaled[ids], kind="stable")]
