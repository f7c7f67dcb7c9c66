"""Drafts made outside the cloud engine (the device's model drafting for the cloud, issue 56): the
engine verifies them in its next step, so greedy output stays token for token the engine's own
whatever the drafts say (right, wrong from the first token, late, disagreeing), sampled output
stays in the target's distribution with a sparse support or none, and drafts that cannot be
verified exactly are refused, naming why."""

from __future__ import annotations

import pytest
import torch

from cloud_engine.sampler import processed_probs
from cloud_engine.spec_decode.outside_drafts import SparseDraftProbs
from sdk.protocol.drafts import OutsideDraft
from cloud_engine.spec_decode.rejection import verify_draft
from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.cloud_engine.test_spec_decode_greedy import build_varied_model, greedy, make_llm
from tests.cloud_engine.test_spec_decode_sampling import (
    DRAFT_LOGITS,
    SAMPLED,
    TARGET_LOGITS,
    TRIALS,
    TRUNCATED,
    V,
    chi_square_p_value,
)
from tests.cloud_engine.tiny_models import VOCAB_SIZE, random_tokens

N = 20  # tokens per answer
K = 4  # draft length


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return make_llm(build_varied_model(tmp_path_factory.mktemp("outside-target"), seed=0))


def run(llm, prompt: list[int], params: SamplingParams, drafter=None, request_id: str = "r") -> tuple[list[int], int]:
    """The answer's tokens and the engine steps it took; before each step `drafter(emitted)` may return
    (start, tokens) to offer, and the offer must be taken unless it returns a third item, the reason."""
    engine = llm.engine
    engine.add_request(GenerationRequest(request_id, prompt, params))
    emitted, steps = [], 0
    try:
        while engine.has_unfinished_requests():
            # A draft needs room: the answer's last token is always the engine's own.
            if drafter is not None and emitted and len(emitted) < params.max_tokens - 1:
                offer = drafter(list(emitted))
                if offer is not None:
                    start, tokens, *expected = offer
                    refused = engine.offer_draft(OutsideDraft(request_id, start, tuple(tokens)))
                    assert refused == (expected[0] if expected else None), (start, tokens, refused)
            emitted += [event.token_id for event in engine.step()]
            steps += 1
    finally:
        engine.abort_all()
    return emitted, steps


def test_greedy_output_is_the_engines_own_whatever_the_drafts_say(llm):
    prompt = random_tokens(12, seed=3)
    reference, plain_steps = run(llm, prompt, greedy(N))
    # Right drafts: the engine's own next tokens. Fewer steps, the same answer.
    right, right_steps = run(llm, prompt, greedy(N), lambda out: (len(out), reference[len(out) : len(out) + K]))
    assert right == reference and right_steps < plain_steps / 2

    # Wrong from the first token: only the engine's own token is emitted, one a step.
    def wrong_first(out):
        return len(out), [(t + 1) % VOCAB_SIZE for t in reference[len(out) : len(out) + K]]

    wrong, wrong_steps = run(llm, prompt, greedy(N), wrong_first)
    assert wrong == reference and wrong_steps == plain_steps

    # Right for two tokens, then wrong: two accepted and the engine's own third, each round.
    def half(out):
        if len(out) + 3 > N:
            return None
        right = reference[len(out) : len(out) + 2]
        return len(out), [*right, (reference[len(out) + 2] + 1) % VOCAB_SIZE]

    halves, _ = run(llm, prompt, greedy(N), half)
    assert halves == reference


def test_late_drafts_are_verified_past_what_was_emitted(llm):
    prompt = random_tokens(10, seed=4)
    reference, plain_steps = run(llm, prompt, greedy(N))
    # Made two tokens ago: its first two tokens are what was emitted since; the rest is verified.
    late, late_steps = run(
        llm,
        prompt,
        greedy(N),
        lambda out: (len(out) - 2, reference[len(out) - 2 : len(out) + K]) if len(out) >= 2 else None,
    )
    assert late == reference and late_steps < plain_steps
    # Disagreeing with what was emitted, wholly in the past, or ahead of the output: dropped.
    cases = [
        (
            lambda out: (
                len(out) - 1,
                [(out[-1] + 1) % VOCAB_SIZE, *reference[len(out) : len(out) + K]],
                "disagrees_with_the_output",
            )
        ),
        (lambda out: (len(out) - 1, [out[-1]], "stale")),
        (lambda out: (len(out) + 1, reference[len(out) + 1 : len(out) + 2] or [0], "ahead_of_the_output")),
    ]
    for index, drafter in enumerate(cases):
        dropped, steps = run(llm, prompt, greedy(N), drafter, request_id=f"dropped-{index}")
        assert dropped == reference and steps == plain_steps


def test_drafts_that_would_make_the_rule_inexact_are_refused(llm):
    prompt = random_tokens(8, seed=5)
    penalised = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, presence_penalty=1.0)
    reference, _ = run(llm, prompt, penalised)
    taken, _ = run(
        llm,
        prompt,
        penalised,
        lambda out: (len(out), reference[len(out) : len(out) + 2] or [0], "sampling_uses_token_history"),
    )
    assert taken == reference
    assert llm.engine.offer_draft(OutsideDraft("nobody", 0, (1,))) == "unknown_request"


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        (OutsideDraft("r", 0, ()), "at least one token"),
        (OutsideDraft("r", 0, (10**6,)), "outside the vocabulary"),
        (OutsideDraft("r", -1, (1,)), "start"),
        (OutsideDraft("r", 0, (1, 2), support=(((1,), (1.0,)),)), "as many supports"),
        (OutsideDraft("r", 0, (1,), support=(((1, 2), (0.9, 0.9)),)), "sum to"),
        (OutsideDraft("r", 0, (1,), support=(((2, 3), (0.5, 0.5)),)), "no probability in its own support"),
        (OutsideDraft("r", 0, (1,), support=(((1,), (float("nan"),)),)), "outside [0, 1]"),
    ],
)
def test_malformed_drafts_are_refused_naming_what_is_wrong(llm, draft, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        llm.engine.offer_draft(draft)


def sparse_support(q: torch.Tensor) -> tuple[tuple[int, ...], tuple[float, ...]]:
    ids = torch.nonzero(q > 0).flatten().tolist()
    return tuple(ids), tuple(float(q[i]) for i in ids)


@pytest.mark.parametrize("with_support", [True, False], ids=["sparse-support", "one-hot"])
def test_a_sampled_draft_keeps_the_targets_distribution(with_support):
    """The device drafts from its own truncated distribution (top-k 5, top-p 0.9: a sparse support); the
    first emitted token follows the target's distribution, whether q is sent or read as one-hot."""
    q = processed_probs(DRAFT_LOGITS[0], TRUNCATED)
    assert int((q > 0).sum()) < V  # the support is truncated
    generator = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q, TRIALS, replacement=True, generator=generator).tolist()
    rows = SparseDraftProbs((sparse_support(q),)) if with_support else None
    counts = torch.zeros(V, dtype=torch.long)
    accepted = 0
    for token in drafts:
        emitted = verify_draft(TARGET_LOGITS[:2], [token], rows, SAMPLED, generator)[0]
        counts[emitted] += 1
        accepted += emitted == token
    assert chi_square_p_value(counts, processed_probs(TARGET_LOGITS[0], SAMPLED)) > 0.001
    if with_support:  # q is what lifts acceptance above one-hot's E[p(x)]
        one_hot_rate = float((q * processed_probs(TARGET_LOGITS[0], SAMPLED)).sum())
        assert accepted / TRIALS > one_hot_rate + 0.02


async def test_drafts_offered_to_the_running_engine_while_it_streams(llm, tmp_path_factory):
    """Through the engine thread (AsyncCloudEngine.offer_draft), drafts posted while the answer streams
    land between steps; the answer is the engine's own, and its events count what the drafts gave."""
    from cloud_engine.async_engine import AsyncCloudEngine
    from cloud_engine.config import CloudEngineConfig

    prompt = random_tokens(12, seed=3)
    reference, _ = run(llm, prompt, greedy(N))
    config = llm.engine.config
    engine = AsyncCloudEngine(
        CloudEngineConfig(
            model=config.model,
            dtype="float32",
            block_size=config.block_size,
            kv_cache_gb=config.kv_cache_gb,
            max_model_len=config.max_model_len,
        )
    ).start()
    try:
        engine.wait_ready(60)
        emitted, last = [], None
        async for event in engine.generate(GenerationRequest("streamed", prompt, greedy(N))):
            emitted.append(event.token_id)
            last = event
            if len(emitted) < N - 1:
                engine.offer_draft(
                    OutsideDraft("streamed", len(emitted), tuple(reference[len(emitted) : len(emitted) + K]))
                )
        assert emitted == reference
        assert last.num_draft_tokens > 0 and last.num_accepted_tokens == last.num_draft_tokens  # right drafts
        engine.offer_draft(OutsideDraft("streamed", 0, (1,)))  # a finished request's draft is dropped, not an error
        engine.offer_draft(OutsideDraft("streamed", 0, ()))  # so is a malformed one
        assert [e.token_id async for e in engine.generate(GenerationRequest("after", prompt, greedy(3)))] == reference[
            :3
        ]
    finally:
        engine.shutdown()
