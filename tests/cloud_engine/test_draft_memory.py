"""A caller's sampled draft stays sparse in the engine (issue 66): what the engine keeps for a draft of the
longest length it takes is its support, not a row of the vocabulary per token, measured as the heap bytes the
offer leaves in use (glibc's count, torch's CPU tensors included). On e22a9a3 the engine made q dense: 16 rows of
a 32k vocabulary, 2 MiB, from a draft of a few hundred bytes. A draft longer than max_draft_tokens is refused."""

from __future__ import annotations

import pytest

from sdk.protocol.drafts import MAX_DRAFT_TOKENS, OutsideDraft
from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.cloud_engine.heap_probe import heap_growth, needs_glibc
from tests.cloud_engine.test_spec_decode_greedy import build_varied_model, make_llm
from tests.cloud_engine.tiny_models import random_tokens

WIDE_VOCAB = 32_768  # the tiny Llama's layers with a real model's vocabulary: a row of it is 128 KiB of float32
ROW_BYTES = WIDE_VOCAB * 4


@pytest.fixture(scope="module")
def wide_llm(tmp_path_factory):
    return make_llm(build_varied_model(tmp_path_factory.mktemp("wide-vocab"), seed=0, vocab_size=WIDE_VOCAB))


def sampled_draft(request_id: str, start: int, tokens: list[int]) -> OutsideDraft:
    """A draft whose every token was drawn from a one-entry support (the sparsest q there is)."""
    return OutsideDraft(request_id, start, tuple(tokens), support=tuple(((t,), (1.0,)) for t in tokens))


@needs_glibc
def test_a_sampled_draft_is_kept_sparse(wide_llm):
    engine = wide_llm.engine
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=3, ignore_eos=True)
    engine.add_request(GenerationRequest("wide", random_tokens(8, seed=2), params))
    try:
        emitted = [event.token_id for event in engine.step()]
        assert len(emitted) == 1  # prefilled: the request decodes from here
        # Warm: a first draft offered and verified, so one-time allocations are not counted as the next one's.
        assert engine.offer_draft(sampled_draft("wide", 1, random_tokens(MAX_DRAFT_TOKENS, seed=4))) is None
        emitted += [event.token_id for event in engine.step()]
        draft = sampled_draft("wide", len(emitted), random_tokens(MAX_DRAFT_TOKENS, seed=5))
        taken = []
        growth = heap_growth(lambda: taken.append(engine.offer_draft(draft)))  # what the engine keeps of it
        assert taken == [None]  # taken: it waits for the next step
        # A dense q kept MAX_DRAFT_TOKENS rows of the vocabulary (2 MiB here); the sparse one, its support.
        assert growth < ROW_BYTES, f"the offer kept {growth} bytes: a vocabulary row per draft token is {ROW_BYTES}"
        events = engine.step()  # verified: the accepted prefix and one token of the target's
        assert 1 <= len(events) <= MAX_DRAFT_TOKENS + 1
        assert engine.stats().num_spec_draft_tokens_total >= MAX_DRAFT_TOKENS
    finally:
        engine.abort_all()


def test_a_draft_longer_than_the_engine_verifies_is_refused(wide_llm):
    engine = wide_llm.engine
    engine.add_request(GenerationRequest("long", random_tokens(8, seed=2), SamplingParams(max_tokens=40)))
    try:
        engine.step()
        with pytest.raises(ValueError, match=f"longer than the {MAX_DRAFT_TOKENS} verified"):
            engine.offer_draft(sampled_draft("long", 1, random_tokens(MAX_DRAFT_TOKENS + 1, seed=5)))
    finally:
        engine.abort_all()
