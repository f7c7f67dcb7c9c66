"""Speculative sampling keeps the target's distribution: chi-square tests of the rejection
sampler on an 8-token vocabulary (with a draft model's q and with n-gram one-hot drafts, with
temperature/top-k/top-p), negative controls showing the test catches a wrong sampler, an
end-to-end check through the engine on a 16-token model, and seeded reproducibility."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from cloud_engine.sampler import processed_probs
from cloud_engine.spec_decode import SpeculativeConfig
from cloud_engine.spec_decode.rejection import verify_draft
from sdk.protocol.engine import SamplingParams
from sdk.engine_common.sampling_defaults import OPENAI_SAMPLING
from tests.cloud_engine.test_spec_decode_greedy import build_varied_model, make_llm


def resolved_params(**fields) -> SamplingParams:
    """What an engine hands its sampler: every field the test leaves out at OpenAI's default."""
    return OPENAI_SAMPLING.apply(SamplingParams(**fields))


V = 8
TRIALS = 10_000
TARGET_LOGITS = torch.tensor(
    [
        [1.5, 0.2, -0.3, 0.9, -1.0, 0.4, 2.0, -0.5],
        [0.1, 1.1, 0.7, -0.8, 0.3, -0.2, 0.0, 1.4],
        [-0.4, 0.6, 1.2, 0.2, -0.1, 0.8, -1.2, 0.5],
    ]
)
DRAFT_LOGITS = torch.tensor(
    [
        [0.3, 1.6, 0.1, -0.5, 1.0, -0.6, 0.4, 0.2],
        [1.0, -0.3, 0.2, 0.6, -0.7, 1.3, 0.1, -0.1],
    ]
)
SAMPLED = resolved_params(max_tokens=8, temperature=1.0)
TRUNCATED = resolved_params(max_tokens=8, temperature=0.7, top_k=5, top_p=0.9)


def broken_resample_from_p(logits, draft, draft_probs, params, generator):
    """Wrong: at a rejection the emitted token is drawn from p, not the residual max(0, p - q)."""
    p = processed_probs(logits[0], params)
    q = draft_probs[0]
    u = float(torch.rand(1, generator=generator)[0])
    if u < min(1.0, float(p[draft[0]]) / float(q[draft[0]])):
        return [draft[0]]
    return [int(torch.multinomial(p, 1, generator=generator)[0])]


def broken_always_accept(logits, draft, draft_probs, params, generator):
    return [draft[0]]


def first_token_counts(
    verify, params, draft_probs_source: str, trials: int = TRIALS, ngram_token: int = 6, seed: int = 0
):
    """Counts of the first emitted token over `trials` verifications of a 1-token draft (the
    first emitted token depends on the first draft position only; one keeps the loop cheap)."""
    generator = torch.Generator().manual_seed(seed)
    q = processed_probs(DRAFT_LOGITS[0], params)[None] if draft_probs_source == "draft" else None
    counts = torch.zeros(V, dtype=torch.long)
    if q is not None:
        drafts = torch.multinomial(q[0], trials, replacement=True, generator=generator)[:, None].tolist()
    else:
        drafts = [[ngram_token]] * trials
    logits = TARGET_LOGITS[:2]
    for draft in drafts:
        counts[verify(logits, draft, q, params, generator)[0]] += 1
    return counts


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    support = probs > 0
    assert int(counts[~support].sum()) == 0, f"tokens outside the target's support were emitted: {counts.tolist()}"
    observed = counts[support].double()
    expected = probs[support].double() / probs[support].double().sum() * observed.sum()
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("params", [SAMPLED, TRUNCATED], ids=["plain", "temperature-top-k-top-p"])
@pytest.mark.parametrize("source", ["draft", "ngram"])
def test_first_emitted_token_follows_the_target(params, source):
    counts = first_token_counts(verify_draft, params, source)
    p = processed_probs(TARGET_LOGITS[0], params)
    if params is TRUNCATED:
        assert int((p > 0).sum()) < V  # the truncation matters: some tokens are excluded
    assert chi_square_p_value(counts, p) > 0.001


def test_ngram_draft_of_an_excluded_token_is_always_rejected():
    """A one-hot draft of a token top-k cuts: never emitted (p = 0 there)."""
    p = processed_probs(TARGET_LOGITS[0], TRUNCATED)
    excluded = int(torch.nonzero(p == 0)[0])
    counts = first_token_counts(verify_draft, TRUNCATED, "ngram", trials=4000, ngram_token=excluded)
    assert counts[excluded] == 0
    assert chi_square_p_value(counts, p) > 0.001


@pytest.mark.parametrize("broken", [broken_resample_from_p, broken_always_accept])
def test_negative_control_a_wrong_sampler_fails_the_test(broken):
    counts = first_token_counts(broken, SAMPLED, "draft")
    assert chi_square_p_value(counts, processed_probs(TARGET_LOGITS[0], SAMPLED)) < 1e-6


def test_bonus_token_after_a_fully_accepted_draft_follows_the_last_row():
    """Draft = the target itself (q = p): always accepted, and the bonus token is drawn from p_k."""
    params = SAMPLED
    p = torch.stack([processed_probs(row, params) for row in TARGET_LOGITS])
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(V, dtype=torch.long)
    for _ in range(3000):
        draft = [int(torch.multinomial(p[i], 1, generator=generator)[0]) for i in range(2)]
        emitted = verify_draft(TARGET_LOGITS, draft, p[:2], params, generator)
        assert emitted[:2] == draft
        counts[emitted[2]] += 1
    assert chi_square_p_value(counts, p[2]) > 0.001


def test_greedy_verification_is_a_prefix_match():
    argmax = TARGET_LOGITS.argmax(dim=-1).tolist()  # [6, 7, 2]
    greedy = resolved_params(max_tokens=8, temperature=0.0)
    g = torch.Generator().manual_seed(0)
    assert verify_draft(TARGET_LOGITS, argmax[:2], None, greedy, g) == argmax
    assert verify_draft(TARGET_LOGITS, [argmax[0], 0], None, greedy, g) == argmax[:2]
    assert verify_draft(TARGET_LOGITS, [0, argmax[1]], None, greedy, g) == argmax[:1]
    assert verify_draft(TARGET_LOGITS[:1], [], None, greedy, g) == argmax[:1]


# -- end to end ----------------------------------------------------------------------------------

SMALL_VOCAB = 16
PROMPT = [5, 9, 3, 12, 7, 4]
E2E_REQUESTS = 200


@pytest.fixture(scope="module")
def small_vocab_models(tmp_path_factory):
    target = build_varied_model(tmp_path_factory.mktemp("sv-target"), seed=3, init=0.5, vocab_size=SMALL_VOCAB)
    # A noisy copy: agrees with the target often enough for accepted runs and bonus tokens.
    draft = build_varied_model(tmp_path_factory.mktemp("sv-draft"), seed=4, noisy_copy_of=target, noise=0.05)
    return target, draft


def target_marginals(target_dir, temperature: float):
    """The target's marginal distributions of output tokens 1, 2 and 3 at PROMPT (from transformers)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    vocab = torch.arange(SMALL_VOCAB)
    with torch.inference_mode():

        def next_probs(prefixes: torch.Tensor) -> torch.Tensor:
            return torch.softmax(model(prefixes).logits[:, -1] / temperature, dim=-1)

        p1 = next_probs(torch.tensor([PROMPT]))[0]  # [V]
        seq2 = torch.cat([torch.tensor(PROMPT).repeat(SMALL_VOCAB, 1), vocab[:, None]], dim=1)
        p2_given = next_probs(seq2)  # [t1, V]
        seq3 = torch.cat([seq2.repeat_interleave(SMALL_VOCAB, 0), vocab.repeat(SMALL_VOCAB)[:, None]], dim=1)
        p3_given = next_probs(seq3).view(SMALL_VOCAB, SMALL_VOCAB, SMALL_VOCAB)  # [t1, t2, V]
    p2 = p1 @ p2_given
    joint12 = p1[:, None] * p2_given
    p3 = (joint12[:, :, None] * p3_given).sum(dim=(0, 1))
    return p1, p2, p3


@pytest.mark.slow
def test_engine_sampling_with_a_draft_model_follows_the_target(small_vocab_models):
    target, draft = small_vocab_models
    temperature = 1.0
    spec = SpeculativeConfig(method="draft", draft_model=draft, num_speculative_tokens=2, adaptive=False)
    llm = make_llm(target, spec, max_num_seqs=16, max_num_batched_tokens=128, kv_cache_gb=0.002)
    params = [
        resolved_params(max_tokens=4, temperature=temperature, seed=i, ignore_eos=True) for i in range(E2E_REQUESTS)
    ]
    outs = llm.generate([PROMPT] * E2E_REQUESTS, params)
    stats = llm.engine.speculator.stats
    assert stats.num_drafts >= E2E_REQUESTS  # every request verified at least one draft
    assert 0.1 < stats.acceptance_rate < 0.9  # accepted runs and rejections both happen
    assert llm.engine.kv_manager.num_used_blocks == 0 and llm.engine.speculator.proposer.num_used_blocks == 0
    tokens = torch.tensor([o.token_ids for o in outs])  # [N, 4]
    for position, probs in enumerate(target_marginals(target, temperature)):
        counts = torch.bincount(tokens[:, position], minlength=SMALL_VOCAB)
        # Cells with tiny expected counts make chi-square unreliable: pool them into one.
        expected = probs * E2E_REQUESTS
        big = expected >= 5
        observed = torch.cat([counts[big], counts[~big].sum()[None]]).double()
        expected = torch.cat([expected[big], expected[~big].sum()[None]]).double()
        if expected[-1] < 1e-9:
            observed, expected = observed[:-1], expected[:-1]
        expected = expected / expected.sum() * observed.sum()
        p_value = float(chisquare(observed.numpy(), expected.numpy()).pvalue)
        assert p_value > 0.001, f"output token {position + 1}: counts {counts.tolist()}, p {probs.tolist()}"


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_seeded_sampling_is_reproducible_with_speculation(small_vocab_models, method):
    target, draft = small_vocab_models
    spec = SpeculativeConfig(
        method=method,
        draft_model=draft if method == "draft" else None,
        ngram_min=1,
        num_speculative_tokens=3,
        adaptive=False,
    )
    llm = make_llm(target, spec)
    params = [resolved_params(max_tokens=8, temperature=0.9, top_p=0.95, seed=s, ignore_eos=True) for s in (7, 8, 9)]
    prompts = [PROMPT, PROMPT[:3], [1, 2, 3, 4, 5, 6, 7, 8]]
    first = [o.token_ids for o in llm.generate(prompts, params)]
    assert llm.engine.speculator.stats.num_drafts > 0
    # Again, alone and in another batch order: the same tokens per seed.
    assert [o.token_ids for o in llm.generate(prompts[::-1], params[::-1])] == first[::-1]
    assert llm.generate([prompts[1]], [params[1]])[0].token_ids == first[1]
    assert len({tuple(t) for t in first}) == 3
