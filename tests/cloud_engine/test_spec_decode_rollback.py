"""Speculative decoding's bookkeeping: drafts scheduled inside the budget, rejected tokens rolled
back (computed count, blocks, never a published block), the KV pools drained after a random
workload, stops (string, token id, max_tokens) inside an accepted run, the n-gram finder and
the adaptive policy."""

from __future__ import annotations

import random

import pytest

from cloud_engine.request import Request
from cloud_engine.scheduler import ModelRunnerOutput
from cloud_engine.spec_decode import SpeculativeConfig
from cloud_engine.spec_decode.ngram import find_continuation
from cloud_engine.spec_decode.policy import SpeculationPolicy
from sdk.protocol.engine import GenerationRequest, SamplingParams
from tests.cloud_engine.conftest import (
    BS,
    make_request,
    make_scheduler,
    runner_output_for,
)
from tests.cloud_engine.test_spec_decode_greedy import build_varied_model, make_llm
from tests.cloud_engine.tiny_models import random_tokens

# -- scheduler level ----------------------------------------------------------------------------


def decoding_request(scheduler, request_id="a", prompt_len=6, max_tokens=20) -> Request:
    """A request past its prefill: prompt_len + 1 tokens, prompt_len computed."""
    request = make_request(request_id, prompt_len, max_tokens=max_tokens)
    scheduler.add_request(request)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens[request_id] == prompt_len
    scheduler.update_from_output(out, runner_output_for(scheduler, out))
    assert (request.num_computed_tokens, request.num_tokens) == (prompt_len, prompt_len + 1)
    return request


def test_draft_is_scheduled_after_the_last_token():
    s = make_scheduler()
    r = decoding_request(s)
    r.spec_token_ids = [11, 12, 13, 14]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 5}
    assert out.scheduled_spec_token_ids == {"a": [11, 12, 13, 14]}
    assert r.spec_token_ids == []  # consumed
    assert len(s.kv_cache_manager.get_block_ids("a")) == s.kv_cache_manager.num_blocks_for(6 + 5)


def test_draft_is_truncated_by_the_budget():
    s = make_scheduler(max_num_batched_tokens=3)
    r = decoding_request(s, prompt_len=3)
    r.spec_token_ids = [11, 12, 13, 14]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 3}
    assert out.scheduled_spec_token_ids == {"a": [11, 12]}


def test_draft_is_truncated_by_max_model_len():
    s = make_scheduler(max_model_len=10)
    r = decoding_request(s, prompt_len=7)  # 8 tokens: room for 2 more positions
    r.spec_token_ids = [11, 12, 13, 14]
    out = s.schedule()
    assert out.scheduled_spec_token_ids == {"a": [11, 12]}
    assert out.num_scheduled_tokens == {"a": 3}


def test_draft_is_dropped_while_the_prefill_is_incomplete():
    s = make_scheduler(max_num_batched_tokens=8)
    r = make_request("a", 20)
    s.add_request(r)
    r.spec_token_ids = [11, 12]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 8} and out.scheduled_spec_token_ids == {}
    s.update_from_output(out, runner_output_for(s, out))
    r.spec_token_ids = [11, 12]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 8} and out.scheduled_spec_token_ids == {}
    assert r.spec_token_ids == []


@pytest.mark.parametrize("num_accepted", [0, 1, 2, 3, 4])
def test_rejected_tokens_are_rolled_back(num_accepted):
    """6-token prompt, 1 output, a 4-token draft: 11 positions (3 blocks) scheduled; the kept
    tokens need num_blocks_for(8 + num_accepted) blocks, the rest go back to the pool."""
    s = make_scheduler(enable_prefix_caching=False)
    kv = s.kv_cache_manager
    r = decoding_request(s)
    draft = [11, 12, 13, 14]
    r.spec_token_ids = list(draft)
    out = s.schedule()
    assert kv.num_used_blocks == 3
    sampled = [*draft[:num_accepted], 99]
    s.update_from_output(out, ModelRunnerOutput({"a": sampled}))
    assert r.output_token_ids[1:] == sampled
    assert r.num_tokens == 8 + num_accepted
    assert r.num_computed_tokens == r.num_tokens - 1  # everything but the target's own new token
    assert kv.num_used_blocks == kv.num_blocks_for(r.num_tokens)
    assert len(kv.get_block_ids("a")) == kv.num_blocks_for(r.num_tokens)
    kv.check_invariants()
    # The next step decodes one token from the rolled-back state.
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1}


def test_too_many_tokens_for_the_draft_is_an_error():
    s = make_scheduler()
    r = decoding_request(s)
    r.spec_token_ids = [11]
    out = s.schedule()
    with pytest.raises(ValueError, match="from a draft of 1"):
        s.update_from_output(out, ModelRunnerOutput({"a": [11, 12, 13]}))


def test_rollback_never_frees_a_published_block():
    s = make_scheduler(enable_prefix_caching=True)
    kv = s.kv_cache_manager
    r = decoding_request(s, prompt_len=2 * BS)  # 2 full blocks published after the prefill
    assert kv._num_published["a"] == 2
    blocks = kv.get_block_ids("a")
    assert kv.free_excess_blocks(r, 1) == 0  # 1 token would need 1 block: the published 2 stay
    assert kv.get_block_ids("a") == blocks
    # A rejected draft spanning a new block: only that block goes back.
    r.spec_token_ids = [11, 12, 13, 14, 15]
    out = s.schedule()
    used = kv.num_used_blocks
    s.update_from_output(out, ModelRunnerOutput({"a": [99]}))
    assert kv.num_used_blocks == used - 1
    assert kv.get_block_ids("a")[:2] == blocks[:2]
    assert all(kv.pool.blocks[b].block_hash is not None for b in blocks[:2])
    kv.check_invariants()


def test_accepted_draft_blocks_are_published():
    s = make_scheduler(enable_prefix_caching=True)
    kv = s.kv_cache_manager
    r = decoding_request(s, prompt_len=3)
    r.spec_token_ids = [11, 12, 13, 14]
    out = s.schedule()
    s.update_from_output(out, ModelRunnerOutput({"a": [11, 12, 13, 14, 99]}))
    assert r.num_computed_tokens == 8 and kv._num_published["a"] == 2
    kv.check_invariants()


# -- engine level: random workloads ------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = build_varied_model(tmp_path_factory.mktemp("rb-target"), seed=0)
    noisy = build_varied_model(tmp_path_factory.mktemp("rb-noisy"), seed=2, noisy_copy_of=target, noise=0.01)
    return target, noisy


def check_books(engine):
    engine.kv_manager.check_invariants()
    if getattr(engine.speculator.proposer, "kv", None) is not None:
        engine.speculator.proposer.kv.check_invariants()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_random_workload_drains_both_pools(models, method):
    target, noisy = models
    spec = SpeculativeConfig(
        method=method,
        draft_model=noisy if method == "draft" else None,
        ngram_min=1,
        num_speculative_tokens=4,
        adaptive=False,
    )
    # A small pool (preemptions) and a small budget (drafts cut beside prefill chunks).
    llm = make_llm(target, spec, kv_cache_gb=0.00006, max_num_batched_tokens=12)
    engine = llm.engine
    rng = random.Random(7)
    for i in range(20):
        prompt = random_tokens(rng.randint(1, 30), seed=100 + i)
        if rng.random() < 0.3:
            prompt = prompt + prompt[: rng.randint(1, len(prompt))]
        temperature = 0.0 if rng.random() < 0.5 else rng.choice([0.7, 1.0])
        params = SamplingParams(
            max_tokens=rng.randint(1, 20),
            temperature=temperature,
            seed=i,
            ignore_eos=True,
            stop_token_ids=[rng.randint(3, 299)] if rng.random() < 0.2 else [],
        )
        engine.add_request(GenerationRequest(f"w{i}", prompt, params))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        check_books(engine)
        steps += 1
        if steps == 5:
            engine.abort_request("w19")  # an abort mid-flight frees the draft state too
    assert engine.kv_manager.num_used_blocks == 0
    if method == "draft":
        assert engine.speculator.proposer.num_used_blocks == 0 and engine.speculator.proposer._seqs == {}
    assert engine.speculator.stats.num_drafts > 0
    assert engine.speculator.draft_probs == {}


# -- stops inside an accepted run ------------------------------------------------------------


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def identical_draft_llm(models):
    target, _ = models
    return make_llm(
        target, SpeculativeConfig(method="draft", draft_model=target, num_speculative_tokens=4, adaptive=False)
    )


@pytest.fixture(scope="module")
def plain_llm(models):
    return make_llm(models[0])


PROMPT = random_tokens(7, seed=31)


def same_output(a, b):
    assert a.token_ids == b.token_ids
    assert a.text == b.text
    assert a.finish_reason == b.finish_reason
    assert [e.num_output_tokens for e in a.events] == [e.num_output_tokens for e in b.events]
    assert a.events[-1].num_output_tokens == len(a.token_ids)


def test_stop_string_inside_an_accepted_run(plain_llm, identical_draft_llm):
    free = plain_llm.generate([PROMPT], greedy(16))[0]
    assert len(set(free.token_ids)) > 8
    texts = [plain_llm.engine.token_text(t) for t in free.token_ids]
    stop = texts[6][1:] + texts[7][:2]  # spans output tokens 7 and 8, mid-run for k = 4
    assert stop in free.text
    expected = plain_llm.generate([PROMPT], greedy(16, stop=[stop]))[0]
    before = identical_draft_llm.engine.num_generation_tokens_total
    out = identical_draft_llm.generate([PROMPT], greedy(16, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.text == free.text[: free.text.index(stop)]
    same_output(out, expected)
    assert identical_draft_llm.engine.num_generation_tokens_total - before == len(expected.token_ids)
    assert identical_draft_llm.engine.speculator.stats.num_accepted_tokens > 0
    assert identical_draft_llm.engine.kv_manager.num_used_blocks == 0
    assert identical_draft_llm.engine.speculator.proposer.num_used_blocks == 0


def test_stop_token_id_inside_an_accepted_run(plain_llm, identical_draft_llm):
    free = plain_llm.generate([PROMPT], greedy(16))[0]
    stop_id = free.token_ids[6]
    index = free.token_ids.index(stop_id)
    expected = plain_llm.generate([PROMPT], greedy(16, stop_token_ids=[stop_id]))[0]
    out = identical_draft_llm.generate([PROMPT], greedy(16, stop_token_ids=[stop_id]))[0]
    assert out.token_ids == free.token_ids[: index + 1] and out.finish_reason == "stop"
    same_output(out, expected)


def test_eos_inside_an_accepted_run(models):
    """Make the target's 7th greedy token its EOS by declaring that token the EOS."""
    target, _ = models
    plain = make_llm(target)
    free = plain.generate([PROMPT], greedy(16))[0]
    eos = free.token_ids[6]
    index = free.token_ids.index(eos)
    spec = make_llm(
        target, SpeculativeConfig(method="draft", draft_model=target, num_speculative_tokens=4, adaptive=False)
    )
    for llm in (plain, spec):
        llm.engine.eos_token_ids = {eos}
    params = SamplingParams(max_tokens=16, temperature=0.0)
    expected, out = plain.generate([PROMPT], params)[0], spec.generate([PROMPT], params)[0]
    assert out.token_ids == free.token_ids[: index + 1] and out.finish_reason == "stop"
    same_output(out, expected)


@pytest.mark.parametrize("max_tokens", [2, 3, 4, 5, 6, 7, 9])
def test_max_tokens_inside_a_run(plain_llm, identical_draft_llm, max_tokens):
    expected = plain_llm.generate([PROMPT], greedy(max_tokens))[0]
    out = identical_draft_llm.generate([PROMPT], greedy(max_tokens))[0]
    assert len(out.token_ids) == max_tokens and out.finish_reason == "length"
    same_output(out, expected)


def test_cut_at_token_stop_limits_a_run_to_max_tokens(identical_draft_llm):
    """The engine's own cut, independent of the policy's cap on k."""
    engine = identical_draft_llm.engine
    request = Request(
        "cut", [5, 6, 7], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, stop_token_ids=[42])
    )
    request.append_output_token(9)
    request.append_output_token(10)
    assert engine.speculator.cut_at_token_stop(request, [1, 3, 4, 8, 9]) == [1, 3, 4]
    assert engine.speculator.cut_at_token_stop(request, [1, 42, 4]) == [1, 42]
    assert engine.speculator.cut_at_token_stop(request, [42]) == [42]


# -- n-gram finder --------------------------------------------------------------------------


def test_ngram_full_match_continues_the_copy():
    assert find_continuation([1, 2, 3, 4, 9, 8, 1, 2, 3, 4], 2, 4, 2) == [9, 8]


def test_ngram_longest_n_first():
    tokens = [2, 3, 4, 10, 9, 3, 4, 11, 2, 3, 4]
    assert find_continuation(tokens, 2, 4, 2) == [10, 9]  # the 3-gram's, not the later 2-gram's [11, 2]
    assert find_continuation(tokens, 2, 2, 2) == [11, 2]


def test_ngram_latest_match_with_k_tokens_after_it():
    assert find_continuation([1, 2, 7, 8, 9, 1, 2, 5, 6, 0, 1, 2], 2, 2, 2) == [5, 6]
    # The latest match has only 2 tokens after it: the earlier one with 3 wins.
    assert find_continuation([1, 2, 8, 9, 6, 3, 1, 2, 1, 2], 3, 2, 2) == [8, 9, 6]
    # A run of one token: the match just behind the suffix is followed by the suffix only.
    assert find_continuation([7, 7, 7], 3, 4, 2) == [7]


def test_ngram_no_match():
    assert find_continuation([1, 2, 3, 4, 5], 3, 4, 2) == []
    assert find_continuation([1, 2, 3, 1], 3, 4, 2) == []
    assert find_continuation([1, 2, 3, 1], 3, 4, 1) == [2, 3, 1]
    assert find_continuation([5], 3, 4, 1) == []
    assert find_continuation([], 3, 4, 1) == []


# -- adaptive policy ----------------------------------------------------------------------------


def policy_request(request_id: str, prompt_len: int = 5, max_tokens: int = 50, num_output: int = 1) -> Request:
    request = Request(request_id, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens, temperature=0.0))
    for _ in range(num_output):
        request.append_output_token(3)
    return request


def test_policy_no_drafting_above_the_batch_limit():
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=2)
    policy = SpeculationPolicy(config, max_model_len=64)
    requests = [policy_request(f"r{i}") for i in range(3)]
    assert policy.num_draft_tokens(requests) == {}
    assert policy.num_draft_tokens(requests[:2]) == {"r0": 4, "r1": 4}
    fixed = SpeculationPolicy(
        SpeculativeConfig(method="ngram", num_speculative_tokens=4, max_batch_for_speculation=2, adaptive=False),
        max_model_len=64,
    )
    assert fixed.num_draft_tokens(requests) == {"r0": 4, "r1": 4, "r2": 4}


def test_policy_low_acceptance_pauses_and_probes_with_one_token():
    from cloud_engine.spec_decode.policy import PROBE_INTERVAL

    policy = SpeculationPolicy(SpeculativeConfig(method="ngram", num_speculative_tokens=4), max_model_len=64)
    bad, good = policy_request("bad"), policy_request("good")
    policy.record("bad", 4, 0)
    policy.record("good", 4, 3)
    plans = [policy.num_draft_tokens([bad, good]) for _ in range(PROBE_INTERVAL)]
    assert all(plan["good"] == 4 for plan in plans)  # above the floor: the full k every step
    assert [plan.get("bad") for plan in plans] == [None] * (PROBE_INTERVAL - 1) + [1]  # paused, then one probe
    policy.record("bad", 1, 1)  # the probe is accepted: smoothed 0.5 * 0 + 0.5 * 1 = 0.5 >= 0.5 tokens
    assert policy.num_draft_tokens([bad]) == {"bad": 4}
    policy.free("bad")
    assert "bad" not in policy._state
    fixed = SpeculationPolicy(
        SpeculativeConfig(method="ngram", num_speculative_tokens=4, adaptive=False), max_model_len=64
    )
    fixed.record("bad", 4, 0)
    assert fixed.num_draft_tokens([bad]) == {"bad": 4}


def test_policy_caps_k_by_remaining_tokens():
    policy = SpeculationPolicy(SpeculativeConfig(method="ngram", num_speculative_tokens=4), max_model_len=20)
    assert policy.num_draft_tokens([policy_request("a", max_tokens=5, num_output=2)]) == {"a": 2}
    assert policy.num_draft_tokens([policy_request("a", max_tokens=3, num_output=2)]) == {}
    assert policy.num_draft_tokens([policy_request("a", prompt_len=16, num_output=1)]) == {"a": 2}  # 17 of 20
    assert policy.num_draft_tokens([policy_request("a", prompt_len=18, num_output=1)]) == {}


def test_draft_cut_by_the_budget_then_fully_matched_by_the_target(models, plain_llm):
    """Regression: a budget of 3 cuts an identical draft of 4 to 2; the target accepts both and
    its bonus token equals the draft's 3rd, whose KV the draft already computed. The draft must
    still recompute the last token (it used to run an empty forward and crash)."""
    target, _ = models
    spec = SpeculativeConfig(method="draft", draft_model=target, num_speculative_tokens=4)
    llm = make_llm(target, spec, max_num_batched_tokens=3, max_num_seqs=1)
    out = llm.generate([[5, 6, 7]], greedy(10))[0]
    assert out.token_ids == plain_llm.generate([[5, 6, 7]], greedy(10))[0].token_ids
    assert llm.engine.speculator.stats.acceptance_rate == 1.0
    assert llm.engine.speculator.proposer.num_used_blocks == 0
