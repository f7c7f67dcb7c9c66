"""tandem's own sampler over the logits llama.cpp returns (numpy, batched).

Confidence signals (logprob, entropy, top-1/top-2 margin, top alternatives) are
computed on the model's own distribution (temperature 1, before truncation), so
they mean the same thing whatever sampling settings a request uses; a greedy
request still gets useful signals. The token is then picked from the logits after the
request's bias, masks and penalties (local_runtime.logits_processors) with its temperature,
min-p, top-k and top-p, using the request's own RNG (reproducible per seed).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from local_runtime.logits_processors import apply_logit_changes, min_p_candidates
from sdk.protocol.engine import SamplingParams
from sdk.engine_common.token_events import SampledToken


def sample_batch(
    logits: np.ndarray,
    params: list[SamplingParams],
    rngs: list[np.random.Generator],
    histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
    end_ids: np.ndarray | None = None,
    allowed: Sequence[np.ndarray | None] | None = None,
    supports: Sequence[bool] | None = None,
) -> list[SampledToken]:
    """Pick one token per row of `logits` ([n_rows, vocab] float32) and measure its row's signals.

    `histories`: each row's (prompt ids, output ids) and `end_ids`: the end-of-generation ids,
    read only for rows whose params change the logits (penalties, logit_bias, min_tokens).
    `allowed`: per row, None or the boolean mask of a structured request's grammar (the pick
    only: the signals and logprobs stay the model's own).
    `supports`: per row, whether to report the distribution a sampled (not greedy) token was drawn from
    (SampledToken.support: a drafting request's, which the verifying tier reads as q)."""
    rows = np.arange(logits.shape[0])
    top1_ids = np.argmax(logits, axis=1)
    shifted, exp = _scratch(logits.shape)
    np.subtract(logits, logits[rows, top1_ids][:, None], out=shifted)  # <= 0, so exp cannot overflow
    np.exp(shifted, out=exp)
    log_z = np.log(exp.sum(axis=1, dtype=np.float64))  # float64 sum: 49k terms
    # H = log Z - E_p[shifted]; a single pass over the row instead of materialising p * log p.
    entropies = log_z - np.multiply(exp, shifted, out=exp).sum(axis=1, dtype=np.float64) / np.exp(log_z)
    shifted[rows, top1_ids] = -np.inf  # the runner-up, without a full partition
    margins = 1.0 / np.exp(log_z) - np.exp(shifted.max(axis=1) - log_z)
    shifted[rows, top1_ids] = 0.0
    results = []
    for row, (p, rng) in enumerate(zip(params, rngs)):
        greedy = p.is_greedy  # raises for params the engine did not resolve
        row_logits = logits[row]
        allowed_ids = None  # a structured row: the ids its grammar allows now
        if p.changes_logits:
            prompt_ids, output_ids = histories[row]
            row_logits = apply_logit_changes(row_logits, p, prompt_ids, output_ids, end_ids)
            if allowed is not None and allowed[row] is not None:
                # Pick among the allowed ids only: the same distribution as masking the rest to
                # -inf, without selecting over tens of thousands of tied -inf (argpartition
                # degraded to ~6 ms a row on them: bench.structured).
                allowed_ids = np.flatnonzero(allowed[row])
                row_logits = row_logits[allowed_ids]
        support = None
        if greedy:
            pick = int(np.argmax(row_logits)) if p.changes_logits else int(top1_ids[row])
        else:
            candidates, probs = _distribution(row_logits, p)
            pick = _draw(candidates, probs, rng)
            if supports is not None and supports[row]:
                support_ids = candidates if allowed_ids is None else allowed_ids[candidates]
                support = (tuple(int(i) for i in support_ids), tuple(float(q) for q in probs))
        token_id = pick if allowed_ids is None else int(allowed_ids[pick])
        row_logprobs = None
        top_ids: list[int] = []
        if p.logprobs:
            row_logprobs = shifted[row] - log_z[row]
            top_ids = _top_ids(row_logprobs, p.logprobs)
        results.append(
            SampledToken(
                token_id=token_id,
                logprob=float(shifted[row, token_id] - log_z[row]),
                entropy=float(max(entropies[row], 0.0)),
                margin=float(margins[row]),
                top_ids=top_ids,
                top_logprobs=[float(row_logprobs[i]) for i in top_ids] if top_ids else [],
                support=support,
            )
        )
    return results


_scratch_local = threading.local()


def _scratch(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 work arrays of `shape`, kept per thread between steps. Fresh 1.5 MB
    temporaries each step cost more than the maths: in the engine, between llama_decode
    calls, every new page faulted in (the signals took 3 ms for 8 rows instead of 0.6)."""
    rows, vocab = shape
    buffers = getattr(_scratch_local, "buffers", None)
    if buffers is None or buffers[0].shape[0] < rows or buffers[0].shape[1] != vocab:
        buffers = tuple(np.empty((max(rows, 16), vocab), dtype=np.float32) for _ in range(2))
        _scratch_local.buffers = buffers
    return buffers[0][:rows], buffers[1][:rows]


def _top_ids(row_logprobs: np.ndarray, k: int) -> list[int]:
    if k <= 0:
        return []
    ids = np.argpartition(row_logprobs, -k)[-k:]
    return [int(i) for i in ids[np.argsort(-row_logprobs[ids], kind="stable")]]


def _distribution(row_logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The ids a sampled token may be (indices into `row_logits`) and their probabilities (float64,
    summing to 1): temperature, then min-p, top-k and top-p."""
    scaled = row_logits.astype(np.float64) / p.temperature
    if p.min_p > 0.0:  # then top-k and top-p over the survivors, renormalised
        candidate_ids = _truncate_sorted(scaled, min_p_candidates(scaled, p.min_p), p.top_k, p.top_p)
    else:
        candidate_ids = _truncate(scaled, p.top_k, p.top_p)
    weights = np.exp(scaled[candidate_ids] - scaled[candidate_ids].max())
    return candidate_ids, weights / weights.sum()


def _draw(candidate_ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(probs)
    choice = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(candidate_ids[min(choice, len(candidate_ids) - 1)])


def _truncate(scaled: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Token ids kept by top-k then top-p, most likely first (exact, without a full sort)."""
    vocab = scaled.shape[0]
    if top_k <= 0 and top_p >= 1.0:
        return np.arange(vocab)
    if top_k > 0:  # top-p applies to the renormalised top-k set
        return _truncate_sorted(scaled, _largest(scaled, min(top_k, vocab)), 0, top_p)
    # The nucleus is nearly always within the top few dozen tokens: widen until it is.
    log_z = _logsumexp(scaled)
    m = 64
    while True:
        ids = _largest(scaled, min(m, vocab))
        kept = _nucleus(scaled, ids, log_z, top_p)
        if len(kept) < len(ids) or len(ids) == vocab:
            return kept
        m *= 4


def _truncate_sorted(scaled: np.ndarray, sorted_ids: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """top-k then top-p within candidates already sorted most likely first."""
    ids = sorted_ids[:top_k] if top_k > 0 else sorted_ids
    return ids if top_p >= 1.0 else _nucleus(scaled, ids, _logsumexp(scaled[ids]), top_p)


def _largest(scaled: np.ndarray, m: int) -> np.ndarray:
    ids = np.argpartition(scaled, -m)[-m:] if m < scaled.shape[0] else np.arange(scaled.shape[0])
    return ids[np.argsort(-scaled[ids], kind="stable")]


def _nucleus(scaled: np.ndarray, sorted_ids: np.ndarray, log_z: float, top_p: float) -> np.ndarray:
    """The shortest head of `sorted_ids` whose probability mass reaches top_p (all if it never does)."""
    mass = np.cumsum(np.exp(scaled[sorted_ids] - log_z))
    return sorted_ids[: int(np.searchsorted(mass, top_p, side="left")) + 1]


def _logsumexp(values: np.ndarray) -> float:
    """log(sum(exp(values))) in three vectorised passes (np.logaddexp.reduce took ~1.4 ms over 49k)."""
    top = values.max()
    return float(top + np.log(np.exp(values - top).sum()))
