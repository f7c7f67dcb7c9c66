"""The cloud sampler: signals on the model's own distribution, exact truncation, per-request seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cloud_engine.sampler import make_generator, sample_batch
from local_runtime.sampler import sample_batch as local_sample_batch
from sdk.protocol.engine import SamplingParams
from sdk.engine_common.sampling_defaults import OPENAI_SAMPLING


def resolved_params(**fields) -> SamplingParams:
    """What an engine hands its sampler: every field the test leaves out at OpenAI's default."""
    return OPENAI_SAMPLING.apply(SamplingParams(**fields))


def _logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _gens(n: int, seed: int | None = 0):
    return [make_generator(None if seed is None else seed + i, torch.device("cpu")) for i in range(n)]


def test_signals_match_the_local_runtime_definition():
    logits = _logits(4)
    params = [resolved_params(temperature=0.0, logprobs=3)] * 4
    cloud = sample_batch(logits, params, _gens(4))
    local = local_sample_batch(logits.numpy(), params, [np.random.default_rng(0)] * 4)
    for c, l in zip(cloud, local):
        assert c.token_id == l.token_id
        assert c.logprob == pytest.approx(l.logprob, abs=1e-5)
        assert c.entropy == pytest.approx(l.entropy, abs=1e-4)
        assert c.margin == pytest.approx(l.margin, abs=1e-5)
        assert c.top_ids == l.top_ids


def test_greedy_is_argmax_and_top_k_one_is_greedy():
    logits = _logits(3)
    out = sample_batch(
        logits, [resolved_params(temperature=0.0), resolved_params(top_k=1), resolved_params(temperature=0.0)], _gens(3)
    )
    assert [t.token_id for t in out] == logits.argmax(dim=1).tolist()


def test_same_seed_same_tokens_different_seed_differs():
    logits = _logits(1, vocab=1000)
    params = [resolved_params(temperature=1.5, seed=7)]
    draw = lambda seed: [
        sample_batch(logits, params, [g])[0].token_id
        for g in [make_generator(seed, torch.device("cpu"))]
        for _ in range(20)
    ]  # noqa: E731
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(logits[0], 0)
    # top_p=0.9: the shortest head reaching 0.9 of the mass.
    head = int(torch.searchsorted(torch.cumsum(probs, 0), torch.tensor(0.9))) + 1
    seen_p = {sample_batch(logits, [resolved_params(top_p=0.9)], [g])[0].token_id for g in _gens(1) for _ in range(300)}
    assert seen_p == set(range(head))
    seen_k = {sample_batch(logits, [resolved_params(top_k=2)], [g])[0].token_id for g in _gens(1) for _ in range(200)}
    assert seen_k == {0, 1}


def test_nucleus_wider_than_the_first_window_is_exact():
    # A flat distribution over 1000 tokens: top_p=0.5 needs ~500 of them, far past 64.
    logits = torch.zeros(1, 1000)
    gen = _gens(1)[0]
    seen = {sample_batch(logits, [resolved_params(top_p=0.5)], [gen])[0].token_id for _ in range(2000)}
    assert 400 < len(seen) <= 500


def test_temperature_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    gen = _gens(1)[0]
    counts = np.bincount(
        [sample_batch(logits, [resolved_params(temperature=1.0)], [gen])[0].token_id for _ in range(3000)], minlength=3
    )
    expected = np.array([0.5, 0.3, 0.2]) * 3000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 13.8  # p = 0.001 with 2 degrees of freedom


def test_logprobs_are_normalised_and_reported_most_likely_first():
    logits = _logits(1, vocab=200)
    token = sample_batch(logits, [resolved_params(temperature=0.0, logprobs=5)], _gens(1))[0]
    assert token.top_ids[0] == token.token_id
    assert token.top_logprobs == sorted(token.top_logprobs, reverse=True)
    assert math.isclose(sum(math.exp(lp) for lp in torch.log_softmax(logits[0], 0).tolist()), 1.0, rel_tol=1e-4)
    assert token.logprob == pytest.approx(token.top_logprobs[0])


def test_batched_nucleus_matches_a_full_sort_row_by_row():
    """Rows sharp and flat (nuclei inside the first window, the second, and past both) and top_p
    from tiny to 1: each row's nucleus is the shortest sorted head reaching its top_p."""
    from cloud_engine.sampler import nucleus_ids

    torch.manual_seed(0)
    vocab = 5000
    rows = torch.cat([torch.randn(4, vocab) * scale for scale in (8.0, 2.0, 0.5, 0.05)])
    top_ps = [0.01, 0.5, 0.9, 0.999] * 4
    for row, (logits, top_p) in enumerate(zip(rows, top_ps)):
        order = torch.argsort(logits, descending=True)
        mass = torch.cumsum(
            torch.exp(logits[order] - torch.logsumexp(logits, dim=0)), dim=0
        )  # the sampler's arithmetic
        expected = order[: int((mass < top_p).sum()) + 1]
        got = nucleus_ids(rows, top_ps)[row]
        # Equal values may come in either order (sort and top-k break ties differently).
        assert set(got.tolist()) == set(expected.tolist()) and torch.equal(logits[got], logits[expected]), row
    sizes = [len(ids) for ids in nucleus_ids(rows, top_ps)]
    assert min(sizes) < 64 and any(64 < s <= 1024 for s in sizes) and max(sizes) > 1024  # every window is exercised


def test_a_row_samples_the_same_alone_or_in_a_batch():
    torch.manual_seed(1)
    logits = torch.randn(6, 3000) * torch.tensor([[4.0], [1.0], [0.2], [3.0], [0.5], [2.0]])
    params = [
        resolved_params(top_p=0.9),
        resolved_params(top_p=0.99),
        resolved_params(top_p=0.5, min_p=0.1),
        resolved_params(top_k=20, top_p=0.8),
        resolved_params(),
        resolved_params(top_p=0.95, temperature=0.7),
    ]
    batched = sample_batch(logits, params, [make_generator(seed, torch.device("cpu")) for seed in range(6)])
    alone = [
        sample_batch(logits[i : i + 1], [params[i]], [make_generator(i, torch.device("cpu"))])[0] for i in range(6)
    ]
    assert [t.token_id for t in batched] == [t.token_id for t in alone]
