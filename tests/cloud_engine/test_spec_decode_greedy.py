"""Speculative decoding keeps greedy output token-for-token identical to decoding without it:
n-gram lookup, a draft model (identical, perturbed, unrelated, layer-skip), batched, adaptive or
not, on tiny random models whose greedy text varies; and on the real SmolLM2 weights (slow)."""

from __future__ import annotations

import pytest
import torch

from cloud_engine.llm import LLM
from cloud_engine.spec_decode import SpeculativeConfig
from sdk.protocol.engine import SamplingParams
from tests.cloud_engine.tiny_models import (
    llama_config,
    random_tokens,
    save_tiny_tokenizer,
)

BLOCK = 4
K = 3


def build_varied_model(
    path, seed: int, init: float = 0.5, noisy_copy_of=None, noise: float = 0.0, vocab_size=None
) -> str:
    """A tiny Llama whose greedy output varies: with the default init (0.02) a random tiny model
    just repeats the last prompt token, so every draft would trivially agree with the target.
    `noisy_copy_of`: the weights of that model plus Gaussian noise (a draft that agrees often,
    not always)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = llama_config()
    config.initializer_range = init
    if vocab_size is not None:
        config.vocab_size = vocab_size
    if noisy_copy_of is not None:
        model = AutoModelForCausalLM.from_pretrained(noisy_copy_of, dtype=torch.float32)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * noise)
    else:
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    save_tiny_tokenizer(path)
    return str(path)


def make_llm(model_dir, spec: SpeculativeConfig | None = None, **overrides) -> LLM:
    config = {
        "dtype": "float32",
        "block_size": BLOCK,
        "kv_cache_gb": 0.001,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 32,
        "max_model_len": 64,
    }
    config.update(overrides)
    if spec is not None:
        config["speculative"] = spec
    return LLM(model_dir, **config)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return build_varied_model(tmp_path_factory.mktemp("spec-target"), seed=0)


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory):
    return build_varied_model(tmp_path_factory.mktemp("spec-other"), seed=1)


@pytest.fixture(scope="module")
def noisy_dir(tmp_path_factory, target_dir):
    return build_varied_model(tmp_path_factory.mktemp("spec-noisy"), seed=2, noisy_copy_of=target_dir, noise=0.01)


def workload() -> tuple[list[list[int]], list[SamplingParams]]:
    """Varied prompt lengths and max_tokens. The random models do not copy their prompt, so
    n-gram lookup drafts from 1-grams: a prompt of 30 distinct tokens, and the seed-5 prompt
    whose output repeats a 2-token phrase (one of those drafts is accepted)."""
    prompts = [
        random_tokens(3, seed=11),
        random_tokens(9, seed=12),
        random_tokens(12, seed=5),
        random_tokens(17, seed=14),
        list(range(3, 33)),
        random_tokens(6, seed=15),
    ]
    params = [greedy(n) for n in (14, 7, 10, 20, 12, 1)]
    return prompts, params


@pytest.fixture(scope="module")
def reference(target_dir):
    prompts, params = workload()
    outs = [o.token_ids for o in make_llm(target_dir).generate(prompts, params)]
    # The workload is non-trivial: the outputs are not a repeated last token.
    assert all(len(set(tokens)) > 3 for tokens, p in zip(outs, params) if p.max_tokens >= 7)
    return outs


def run_spec(model_dir, spec: SpeculativeConfig, **overrides):
    llm = make_llm(model_dir, spec, **overrides)
    prompts, params = workload()
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    assert llm.engine.kv_manager.num_used_blocks == 0
    llm.engine.kv_manager.check_invariants()
    if spec.method == "draft":
        assert llm.engine.speculator.proposer.num_used_blocks == 0
        llm.engine.speculator.proposer.kv.check_invariants()
    return llm, outs


@pytest.mark.parametrize("adaptive", [False, True])
def test_ngram_drafts_keep_greedy_output(target_dir, reference, adaptive):
    llm, outs = run_spec(
        target_dir, SpeculativeConfig(method="ngram", ngram_min=1, num_speculative_tokens=K, adaptive=adaptive)
    )
    assert outs == reference
    stats = llm.engine.speculator.stats
    assert stats.num_drafts >= 3 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_identical_draft_model_accepts_everything(target_dir, reference):
    spec = SpeculativeConfig(
        method="draft", draft_model=target_dir, num_speculative_tokens=K, max_batch_for_speculation=8
    )
    llm, outs = run_spec(target_dir, spec)
    assert outs == reference
    stats = llm.engine.speculator.stats
    assert stats.num_drafts > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens and stats.acceptance_rate == 1.0
    assert stats.accepted_per_position[0] == stats.num_drafts


def test_identical_draft_mean_acceptance_length_is_k_plus_one(target_dir):
    """One request whose max_tokens leaves room for whole drafts only: every draft has K tokens."""
    spec = SpeculativeConfig(method="draft", draft_model=target_dir, num_speculative_tokens=K)
    llm = make_llm(target_dir, spec)
    prompt = random_tokens(7, seed=21)
    n = 1 + 4 * (K + 1)
    out = llm.generate([prompt], greedy(n))[0].token_ids
    assert out == make_llm(target_dir).generate([prompt], greedy(n))[0].token_ids
    stats = llm.engine.speculator.stats
    assert stats.num_drafts == 4 and stats.num_draft_tokens == 4 * K
    assert stats.mean_acceptance_length == K + 1
    assert stats.accepted_per_position == [4] * K


@pytest.mark.parametrize("adaptive", [False, True])
def test_perturbed_draft_model_with_rejections_keeps_greedy_output(target_dir, noisy_dir, reference, adaptive):
    spec = SpeculativeConfig(method="draft", draft_model=noisy_dir, num_speculative_tokens=K, adaptive=adaptive)
    llm, outs = run_spec(target_dir, spec)
    assert outs == reference
    stats = llm.engine.speculator.stats
    assert stats.num_drafts > 0
    assert 0.0 < stats.acceptance_rate < 0.9  # partial acceptance: the rollback paths ran


def test_unrelated_draft_model_keeps_greedy_output(target_dir, other_dir, reference):
    spec = SpeculativeConfig(method="draft", draft_model=other_dir, num_speculative_tokens=K, adaptive=False)
    llm, outs = run_spec(target_dir, spec)
    assert outs == reference
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.acceptance_rate < 0.9


def test_layer_skip_draft_keeps_greedy_output(target_dir, reference):
    spec = SpeculativeConfig(
        method="draft", draft_model=target_dir, draft_num_layers=1, num_speculative_tokens=K, adaptive=False
    )
    llm, outs = run_spec(target_dir, spec)
    assert outs == reference
    assert len(llm.engine.speculator.proposer.runner.model.model.layers) == 1
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.acceptance_rate < 0.9


def test_speculation_under_a_tight_token_budget(target_dir, noisy_dir, reference):
    """A budget of 8 tokens: drafts get cut by the budget beside prefill chunks and other decodes."""
    spec = SpeculativeConfig(method="draft", draft_model=noisy_dir, num_speculative_tokens=4, adaptive=False)
    llm, outs = run_spec(target_dir, spec, max_num_batched_tokens=8)
    assert outs == reference
    assert llm.engine.speculator.stats.num_drafts > 0


# -- the real model (slow) ---------------------------------------------------------------------

REAL_TOKENS = 24
CHAT = [
    "List three prime numbers.",
    "Repeat this text exactly: The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat.",
]


@pytest.fixture(scope="module")
def real_prompts():
    llm = LLM(None, dtype="float32", kv_cache_gb=0.05, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=512)
    prompts = [llm.engine.apply_chat_template([{"role": "user", "content": q}]) for q in CHAT]
    outs = [o.token_ids for o in llm.generate(prompts, greedy(REAL_TOKENS))]
    return prompts, outs


def real_llm(spec):
    return LLM(
        None,
        speculative=spec,
        dtype="float32",
        kv_cache_gb=0.05,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        max_model_len=512,
    )


@pytest.mark.slow
def test_real_model_ngram_keeps_greedy_output(real_prompts):
    prompts, expected = real_prompts
    llm = real_llm(SpeculativeConfig(method="ngram", num_speculative_tokens=4))
    assert [o.token_ids for o in llm.generate(prompts, greedy(REAL_TOKENS))] == expected
    # The input-grounded prompt alone: the copy is predictable from the prompt.
    llm.engine.speculator.stats.__init__()
    assert llm.generate([prompts[-1]], greedy(REAL_TOKENS))[0].token_ids == expected[-1]
    stats = llm.engine.speculator.stats
    assert stats.num_drafts > 0 and stats.acceptance_rate > 0.3
    assert llm.engine.kv_manager.num_used_blocks == 0


@pytest.mark.slow
def test_real_model_layer_skip_draft_keeps_greedy_output(real_prompts):
    from sdk.engine_common.model_files import default_model_path

    prompts, expected = real_prompts
    llm = real_llm(
        SpeculativeConfig(
            method="draft", draft_model=default_model_path(), draft_num_layers=8, num_speculative_tokens=3
        )
    )
    assert [o.token_ids for o in llm.generate(prompts, greedy(REAL_TOKENS))] == expected
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.acceptance_rate < 1.0
    assert llm.engine.kv_manager.num_used_blocks == 0 and llm.engine.speculator.proposer.num_used_blocks == 0
