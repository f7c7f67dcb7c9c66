"""Every model family through the whole engine, against transformers: greedy answers of 32 tokens and
their log-probabilities with chunked prefill, a batch of mixed lengths and a prefix-cache hit; the
n-gram speculator and drafts from outside keep those answers. Tiny random-weight models whose greedy
text varies (initialised wide: a narrowly initialised tiny model repeats its last prompt token).

Under TANDEM_CLOUD_COMPILE=on (CI's second pass over this folder) the same tests run every decode
and verification step of every family through the compiled graph.
"""

from __future__ import annotations

import pytest
import torch

from cloud_engine.spec_decode import SpeculativeConfig
from sdk.protocol.drafts import OutsideDraft
from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.cloud_engine.test_spec_decode_greedy import make_llm
from tests.cloud_engine.tiny_models import (
    VOCAB_SIZE,
    gemma3_config,
    mixtral_config,
    phi3_config,
    qwen3_config,
    qwen3_moe_config,
    random_tokens,
    save_tiny_tokenizer,
)

FAMILIES = {
    "qwen3": qwen3_config,
    "phi3": phi3_config,
    "gemma3": gemma3_config,
    "qwen3-moe": qwen3_moe_config,
    "mixtral": mixtral_config,
}
NUM_TOKENS = 32
# Prompts longer and shorter than Gemma's 6-position window and than a 4-token block; the last shares
# the first's first 12 tokens (3 full blocks), so it finds them cached.
PROMPTS = [random_tokens(17, seed=41), random_tokens(5, seed=42), random_tokens(29, seed=43)]
PROMPTS.append(PROMPTS[0][:12] + random_tokens(6, seed=44))
LOGPROB_TOLERANCE = 1e-3  # float32 on both sides; the engine's step shapes differ from HF's


def greedy(n: int = NUM_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module", params=list(FAMILIES), ids=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family name, model directory, HF reference answers as (tokens, logprobs) per prompt)."""
    from transformers import AutoModelForCausalLM

    config = FAMILIES[request.param]()
    config.initializer_range = 0.5
    # Untied: with a tied head, a model whose residual stream is mostly the last token's embedding (Gemma's, scaled
    # by sqrt(hidden)) answers that token forever. test_model_reference covers the tied heads.
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    save_tiny_tokenizer(path)
    hf.generation_config.eos_token_id = None
    answers = []
    with torch.no_grad():
        for prompt in PROMPTS:
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=NUM_TOKENS,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            tokens = out.sequences[0, len(prompt) :].tolist()
            logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens)]
            answers.append((tokens, logprobs))
    # The answers vary: a tiny model that only repeated a token would make the comparisons trivial.
    assert all(len(set(tokens)) > 4 for tokens, _ in answers)
    return request.param, str(path), answers


# test_spec_decode_greedy's tiny engine (block size 4, 4 sequences), with room for these prompts and a budget
# of 8 tokens: prompts run in chunks beside the other requests' decodes.
ENGINE = {"kv_cache_gb": 0.002, "max_num_batched_tokens": 8, "max_model_len": 96}


def test_greedy_answers_and_logprobs_match_transformers(family):
    name, path, answers = family
    llm = make_llm(path, **ENGINE)
    outs = llm.generate(PROMPTS[:3], greedy())  # a batch of mixed lengths
    hits_before = llm.engine.kv_manager.num_prefix_cache_hits_total
    outs += llm.generate(PROMPTS[3:], greedy())
    assert llm.engine.kv_manager.num_prefix_cache_hits_total - hits_before >= 12, f"{name}: no prefix-cache hit"
    for i, (out, (tokens, logprobs)) in enumerate(zip(outs, answers)):
        assert out.token_ids == tokens, f"{name}: prompt {i} answered differently from transformers"
        ours = torch.tensor([event.logprob for event in out.events])
        torch.testing.assert_close(ours, torch.tensor(logprobs), atol=LOGPROB_TOLERANCE, rtol=0)
    assert llm.engine.kv_manager.num_used_blocks == 0


def test_ngram_speculation_keeps_the_greedy_answers(family):
    name, path, answers = family
    spec = SpeculativeConfig(method="ngram", ngram_min=1, num_speculative_tokens=3, adaptive=False)
    llm = make_llm(path, spec, **{**ENGINE, "max_num_batched_tokens": 32})
    outs = llm.generate(PROMPTS, [SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)] * 4)
    assert [o.token_ids for o in outs] == [tokens for tokens, _ in answers], name
    assert llm.engine.speculator.stats.num_draft_tokens > 0, f"{name}: nothing was drafted"
    assert llm.engine.kv_manager.num_used_blocks == 0


def test_outside_drafts_are_verified(family):
    """A device's drafts: right ones are accepted (fewer steps), wrong ones change nothing."""
    name, path, answers = family
    llm = make_llm(path, **{**ENGINE, "max_num_batched_tokens": 32})
    engine, prompt, reference = llm.engine, PROMPTS[2], answers[2][0]
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    for wrong in (False, True):
        engine.add_request(GenerationRequest(f"r{wrong}", prompt, params))
        emitted, steps = [], 0
        while engine.has_unfinished_requests():
            if emitted and len(emitted) < NUM_TOKENS - 1:
                draft = reference[len(emitted) : len(emitted) + 4]
                draft = [(t + 1) % VOCAB_SIZE for t in draft] if wrong else draft
                assert engine.offer_draft(OutsideDraft(f"r{wrong}", len(emitted), tuple(draft))) is None
            emitted += [event.token_id for event in engine.step()]
            steps += 1
        assert emitted == reference, f"{name}: drafts ({'wrong' if wrong else 'right'}) changed the answer"
        # One step for the prompt and the first token; then right drafts emit up to 5 tokens a step, wrong ones 1.
        assert steps < NUM_TOKENS / 2 if not wrong else steps >= NUM_TOKENS, (name, wrong, steps)
    assert engine.kv_manager.num_used_blocks == 0
