"""The numpy sampler: signals match a float64 reference; truncation and seeds behave."""

import numpy as np
import pytest

from local_runtime.sampler import _truncate, sample_batch
from sdk.protocol.engine import SamplingParams
from sdk.engine_common.sampling_defaults import OPENAI_SAMPLING


def resolved_params(**fields) -> SamplingParams:
    """What an engine hands its sampler: every field the test leaves out at OpenAI's default."""
    return OPENAI_SAMPLING.apply(SamplingParams(**fields))


def reference_signals(row):
    x = row.astype(np.float64)
    logp = x - x.max() - np.log(np.exp(x - x.max()).sum())
    p = np.exp(logp)
    top = np.sort(p)[::-1]
    return logp, -(p * logp).sum(), top[0] - top[1]


def test_signals_match_a_float64_reference():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, 4096)) * 4).astype(np.float32)
    params = [resolved_params(temperature=0.0, logprobs=3) for _ in range(5)]
    out = sample_batch(logits.copy(), params, [np.random.default_rng(1)] * 5)
    for row, token in zip(logits, out):
        logp, entropy, margin = reference_signals(row)
        assert token.token_id == int(np.argmax(row))
        assert token.logprob == pytest.approx(logp[token.token_id], abs=1e-5)
        assert token.entropy == pytest.approx(entropy, rel=1e-4)
        assert token.margin == pytest.approx(margin, abs=1e-6)
        assert token.top_ids == list(np.argsort(-logp)[:3])
        assert token.top_logprobs == pytest.approx([logp[i] for i in token.top_ids], abs=1e-5)


def test_top_p_and_top_k_keep_exactly_the_nucleus():
    rng = np.random.default_rng(3)
    for _ in range(50):
        scaled = rng.standard_normal(3000) * rng.uniform(0.5, 8)
        order = np.argsort(-scaled)
        probs = np.exp(scaled[order] - np.logaddexp.reduce(scaled))
        top_p = rng.uniform(0.05, 0.99)
        expected = order[: int(np.searchsorted(np.cumsum(probs), top_p)) + 1]
        assert list(_truncate(scaled, 0, top_p)) == list(expected)
        assert list(_truncate(scaled, 7, 1.0)) == list(order[:7])


def test_seeded_sampling_reproduces_and_follows_the_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.2, 1e-9]], dtype=np.float32))
    params = [resolved_params(temperature=1.0, seed=11)]

    def draw(n, seed):
        rng = np.random.default_rng(seed)
        return [sample_batch(logits.copy(), params, [rng])[0].token_id for _ in range(n)]

    assert draw(50, 11) == draw(50, 11)
    counts = np.bincount(draw(4000, 5), minlength=4) / 4000
    assert counts == pytest.approx([0.5, 0.3, 0.2, 0.0], abs=0.03)


def test_a_grammar_mask_samples_exactly_as_masking_the_rest_to_minus_infinity():
    """The sampler picks among the allowed ids only (fast); the pick must be the one the same
    random draw gives over the full row with every disallowed logit at -inf."""
    from local_runtime.sampler import _distribution, _draw

    rng = np.random.default_rng(7)
    for trial in range(200):
        row = (rng.standard_normal(2000) * 3).astype(np.float32)
        allowed = rng.random(2000) < rng.choice([0.001, 0.01, 0.5, 1.0])
        allowed[rng.integers(2000)] = True
        fields = [
            dict(temperature=0.7, top_p=0.9),
            dict(temperature=1.0, top_k=5),
            dict(temperature=0.5, min_p=0.1, top_p=0.95),
        ][trial % 3]
        params = resolved_params(**fields, presence_penalty=0.1)  # a row that changes logits, as structured ones do
        got = sample_batch(
            row[None].copy(), [params], [np.random.default_rng(trial)], [([], [])], np.array([0]), [allowed]
        )[0]
        masked = np.where(allowed, row, -np.inf)
        assert got.token_id == _draw(*_distribution(masked, params), np.random.default_rng(trial)), trial
        assert allowed[got.token_id]


def test_a_drafting_row_reports_the_distribution_its_token_was_drawn_from():
    """A drafting request's q (issue 56): the support is exactly the truncated set, renormalised, and the
    token is drawn from it (a wrong q would make the cloud's verification inexact)."""
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    params = resolved_params(temperature=1.0, top_p=0.7)  # the nucleus: the first two tokens
    plain, drafting = (
        sample_batch(logits.copy(), [params], [np.random.default_rng(3)], supports=[flag])[0] for flag in (False, True)
    )
    assert plain.support is None and plain.token_id == drafting.token_id  # asking for q draws the same token
    ids, probs = drafting.support
    assert sorted(ids) == [0, 1] and drafting.token_id in ids
    assert dict(zip(ids, probs)) == pytest.approx({0: 0.625, 1: 0.375})
    greedy = sample_batch(
        logits.copy(), [resolved_params(temperature=0.0)], [np.random.default_rng(3)], supports=[True]
    )
    assert greedy[0].support is None  # greedy drafts are verified one-hot


def test_a_structured_drafting_row_reports_its_support_within_the_grammar():
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(300) * 2).astype(np.float32)
    allowed = np.zeros(300, dtype=bool)
    allowed[[3, 50, 120, 299]] = True
    params = resolved_params(temperature=0.8, presence_penalty=0.1)
    got = sample_batch(row[None].copy(), [params], [rng], [([], [])], np.array([0]), [allowed], [True])[0]
    ids, probs = got.support
    assert set(ids) == {3, 50, 120, 299} and got.token_id in ids
    assert sum(probs) == pytest.approx(1.0)
