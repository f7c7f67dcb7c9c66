"""The cloud engine's token-budget scheduler, driven by a fake runner (see conftest.Driver)."""

from __future__ import annotations

import pytest

from cloud_engine.scheduler import ModelRunnerOutput, TokenAllowance
from sdk.protocol.request_status import RequestStatus
from tests.cloud_engine.conftest import (
    BS,
    FAKE_TOKEN_BASE,
    Driver,
    make_request,
    make_requests,
    make_scheduler,
    runner_output_for,
)

# -- configuration and bookkeeping ---------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        dict(max_num_seqs=0),
        dict(max_num_batched_tokens=0),
        dict(long_prefill_token_threshold=-1),
        dict(policy="lifo"),
        dict(enable_chunked_prefill=False, max_num_batched_tokens=32, max_model_len=64),
        dict(num_blocks=15, max_model_len=64),  # 60 tokens of KV for a 64-token request
    ],
)
def test_rejects_configs_that_cannot_work(overrides):
    with pytest.raises(ValueError):
        make_scheduler(**overrides)


def test_duplicate_or_oversized_requests_are_rejected_and_unknown_finish_is_none():
    s = make_scheduler(max_model_len=16)
    s.add_request(make_request("a", 4))
    with pytest.raises(ValueError):
        s.add_request(make_request("a", 4))
    with pytest.raises(ValueError):
        s.add_request(make_request("big", 17))
    assert s.finish_request("nope", RequestStatus.FINISHED_ABORTED) is None
    with pytest.raises(ValueError):
        s.finish_request("a", RequestStatus.RUNNING)


def test_empty_schedule_when_idle():
    s = make_scheduler()
    out = s.schedule()
    assert out.is_empty and out.total_num_scheduled_tokens == 0 and not s.has_unfinished_requests()


def test_single_request_prefill_then_one_token_decodes():
    d = Driver(make_scheduler())
    (r,) = make_requests(1, 10, 5)
    d.add(r)
    rec = d.step()
    assert rec.out.num_scheduled_tokens == {"r0": 10} and rec.out.new_request_ids == ["r0"]
    assert rec.sampled == ["r0"] and r.output_token_ids == [FAKE_TOKEN_BASE]
    for _ in range(4):
        assert d.step().out.num_scheduled_tokens == {"r0": 1}
    assert r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 5
    d.assert_drained()


def test_runner_must_sample_exactly_the_requests_that_caught_up():
    s = make_scheduler(max_num_batched_tokens=8)
    s.add_request(make_request("a", 12))
    out = s.schedule()
    with pytest.raises(ValueError):
        s.update_from_output(out, ModelRunnerOutput({"a": 7}))  # a prefilled only 8 of 12 tokens
    assert s.requests["a"].num_computed_tokens == 0, "a rejected output changes nothing"
    s.update_from_output(out, runner_output_for(s, out))
    out = s.schedule()
    with pytest.raises(ValueError):
        s.update_from_output(out, ModelRunnerOutput({}))  # caught up but not sampled


# -- budget, slots, chunked prefill ----------------------------------------------------------


def test_token_budget_and_max_num_seqs_hold_every_step():
    budget = 16
    d = Driver(make_scheduler(num_blocks=64, max_num_seqs=3, max_num_batched_tokens=budget))
    specs = [(30, 6), (5, 9), (17, 3), (1, 7), (12, 12), (40, 2), (3, 5), (8, 8)]
    d.add(*[make_request(f"r{i}", n, m, arrival_time=float(i)) for i, (n, m) in enumerate(specs)])
    d.run()
    for rec in d.steps:
        assert rec.out.total_num_scheduled_tokens <= budget
        assert len(rec.out.num_scheduled_tokens) <= 3
        for rid, n in rec.out.num_scheduled_tokens.items():
            if rec.before[rid][0] >= d.all_requests[rid].num_prompt_tokens:
                assert n == 1, f"{rid} decoded {n} tokens in one step"
    assert any(rec.out.total_num_scheduled_tokens == budget for rec in d.steps)
    assert not d.preempted
    d.assert_drained()


def test_chunked_prefill_splits_a_long_prompt_while_decodes_continue():
    d = Driver(make_scheduler(max_num_batched_tokens=10))
    a = make_request("a", 4, max_tokens=10, arrival_time=0.0)
    b = make_request("b", 40, max_tokens=2, arrival_time=1.0)
    d.add(a)
    d.step()
    d.add(b)
    chunks = []
    while b.num_output_tokens == 0:
        rec = d.step()
        assert rec.out.num_scheduled_tokens["a"] == 1, "the decode goes first, every step"
        chunks.append(rec.out.num_scheduled_tokens["b"])
    assert chunks == [9, 9, 9, 9, 4] and sum(chunks) == 40
    d.run()
    d.assert_drained()


def test_a_prefill_budget_caps_prompt_tokens_per_step_but_never_the_decodes():
    d = Driver(make_scheduler(max_num_batched_tokens=64))
    a = make_request("a", 4, max_tokens=30, arrival_time=0.0)
    d.add(a)
    d.step()
    b, c = make_request("b", 20, max_tokens=2, arrival_time=1.0), make_request("c", 10, max_tokens=2, arrival_time=2.0)
    d.add(b, c)
    assert d.s.num_decoding() == 1
    chunks = []
    while b.num_output_tokens == 0:
        rec = d.step(prefill=TokenAllowance(6))
        assert rec.out.num_scheduled_tokens["a"] == 1, "the decode runs every step, whatever the prefill budget"
        chunks.append({rid: n for rid, n in rec.out.num_scheduled_tokens.items() if rid != "a"})
    # 6 prompt tokens a step in all: b's chunks first, then c's prompt takes what b leaves (FCFS).
    assert [sum(step.values()) for step in chunks[:-1]] == [6, 6, 6] and chunks[0] == {"b": 6}
    assert chunks[-1]["b"] == 2 and chunks[-1]["c"] == 4
    d.run()
    d.assert_drained()


def test_long_prefill_token_threshold_caps_one_requests_chunk():
    d = Driver(make_scheduler(max_num_batched_tokens=32, long_prefill_token_threshold=8))
    a, b = make_requests(2, 20, 2)
    d.add(a, b)
    rec = d.step()
    assert rec.out.num_scheduled_tokens == {"r0": 8, "r1": 8}
    assert d.step().out.num_scheduled_tokens == {"r0": 8, "r1": 8}
    assert d.step().out.num_scheduled_tokens == {"r0": 4, "r1": 4}
    d.run()
    d.assert_drained()


def test_no_chunking_when_disabled_a_prompt_runs_whole_or_waits():
    d = Driver(make_scheduler(max_num_batched_tokens=64, enable_chunked_prefill=False, max_num_seqs=4))
    a = make_request("a", 30, max_tokens=4, arrival_time=0.0)
    b = make_request("b", 40, max_tokens=2, arrival_time=1.0)
    c = make_request("c", 3, max_tokens=2, arrival_time=2.0)
    d.add(a, b, c)
    rec = d.step()
    # b does not fit the 34 tokens left and is not split; c waits behind it (FCFS).
    assert rec.out.num_scheduled_tokens == {"a": 30}
    rec = d.step()
    assert rec.out.num_scheduled_tokens == {"a": 1, "b": 40, "c": 3}
    d.run()
    for rec in d.steps:
        for rid, n in rec.out.num_scheduled_tokens.items():
            assert n == 1 or rec.before[rid][0] == 0, "a prompt was split"
    d.assert_drained()


def test_continuous_batching_new_requests_join_as_others_finish():
    d = Driver(make_scheduler(max_num_seqs=2, max_num_batched_tokens=64))
    d.add(*[make_request(f"r{i}", 4, m, arrival_time=float(i)) for i, m in enumerate([2, 8, 3, 3])])
    assert set(d.step().out.num_scheduled_tokens) == {"r0", "r1"}
    assert [r.request_id for r in d.s.waiting] == ["r2", "r3"]
    assert d.step().finished == ["r0"]
    rec = d.step()
    assert rec.out.num_scheduled_tokens == {"r1": 1, "r2": 4}
    assert rec.out.finished_ids == ["r0"], "the runner hears of finished requests on the next step"
    d.run()
    d.assert_drained()


def test_never_scheduled_past_max_model_len():
    d = Driver(make_scheduler(max_model_len=12, num_blocks=8))
    (r,) = make_requests(1, 10, 50)
    d.add(r)
    d.run()
    # 12 positions computed; the 13th token is sampled from the 12th's logits and ends it.
    assert r.num_computed_tokens == 12 and r.num_tokens == 13
    assert r.status == RequestStatus.FINISHED_LENGTH
    d.assert_drained()


# -- prefix caching --------------------------------------------------------------------------


def test_prefix_hit_at_admission_reuses_blocks_and_computes_the_rest():
    d = Driver(make_scheduler())
    common = list(range(1, 11))  # 2 full blocks + 2
    a = make_request("a", common + [50, 51], max_tokens=6, arrival_time=0.0)
    d.add(a)
    d.step()
    b = make_request("b", common + [60, 61, 62], max_tokens=3, arrival_time=1.0)
    d.add(b)
    rec = d.step()
    assert rec.out.num_cached_tokens == {"b": 8} and b.num_cached_tokens == 8
    assert rec.before["b"] == (8, 13) and rec.out.num_scheduled_tokens["b"] == 5
    shared = d.kv.get_block_ids("a")[:2]
    assert d.kv.get_block_ids("b")[:2] == shared and rec.out.new_block_ids["b"][:2] == shared
    assert all(d.pool.blocks[i].ref_count == 2 for i in shared)
    assert d.kv.num_prefix_cache_hits_total == 8 and d.kv.num_prefix_cache_queries_total == 12 + 13
    d.run()
    d.assert_drained()
    assert d.pool.num_cached_blocks > 0, "finished requests leave their blocks cached"


def test_identical_prompt_recomputes_only_its_last_block():
    d = Driver(make_scheduler())
    prompt = list(range(1, 9))  # exactly 2 blocks
    d.add(make_request("a", prompt, 2, arrival_time=0.0))
    d.run()
    b = make_request("b", prompt, 2, arrival_time=1.0)
    d.add(b)
    rec = d.step()
    assert rec.out.num_cached_tokens == {"b": 4} and rec.out.num_scheduled_tokens == {"b": 4}
    d.run()
    d.assert_drained()


def test_a_prompt_exactly_filling_a_block():
    d = Driver(make_scheduler())
    a = make_request("a", [1, 2, 3, 4], max_tokens=3, arrival_time=0.0)
    d.add(a)
    rec = d.step()
    assert rec.out.num_scheduled_tokens == {"a": 4} and len(rec.out.new_block_ids["a"]) == 1
    assert d.pool.num_cached_blocks == 1
    rec = d.step()  # the first output token starts a second block
    assert rec.out.num_scheduled_tokens == {"a": 1} and len(rec.out.new_block_ids["a"]) == 1
    b = make_request("b", [1, 2, 3, 4], max_tokens=1, arrival_time=1.0)
    d.add(b)
    rec = d.step()
    assert rec.out.num_cached_tokens == {"b": 0} and rec.out.num_scheduled_tokens["b"] == 4
    d.run()
    d.assert_drained()


def test_prefix_caching_off_computes_everything():
    d = Driver(make_scheduler(enable_prefix_caching=False))
    prompt = list(range(1, 11))
    d.add(make_request("a", prompt, 2, arrival_time=0.0))
    d.run()
    d.add(make_request("b", prompt, 2, arrival_time=1.0))
    rec = d.step()
    assert rec.out.num_cached_tokens == {"b": 0} and rec.out.num_scheduled_tokens == {"b": 10}
    d.run()
    d.assert_drained()
    assert d.pool.num_cached_blocks == 0


# -- preemption ------------------------------------------------------------------------------


def test_fcfs_preempts_the_newest_and_it_recomputes_to_completion():
    # 6 blocks of 4 = 24 slots; each request grows to 8 + 9 = 17 tokens (5 blocks).
    d = Driver(make_scheduler(num_blocks=6, max_model_len=24, max_num_seqs=2))
    a, b, c = (make_request(f"r{i}", 8 if i < 2 else 4, 10 if i < 2 else 2, arrival_time=float(i)) for i in range(3))
    d.add(a, b, c)
    assert set(d.step().out.num_scheduled_tokens) == {"r0", "r1"}
    while not d.preempted:
        rec = d.step()
    assert rec.out.preempted_ids == ["r1"], "the most recently arrived running request is the victim"
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert [r.request_id for r in d.s.waiting] == ["r1", "r2"], "requeued at the front"
    assert set(rec.out.num_scheduled_tokens) == {"r0"}, "no admission in a step that preempted"
    assert d.s.num_preemptions_total == 1
    outputs_so_far = list(b.output_token_ids)
    assert outputs_so_far
    d.run()
    assert b.status == RequestStatus.FINISHED_LENGTH and b.num_output_tokens == 10
    assert b.output_token_ids[: len(outputs_so_far)] == outputs_so_far
    p = next(i for i, rec in enumerate(d.steps) if rec.out.preempted_ids)
    readmitted = next(rec for rec in d.steps[p + 1 :] if "r1" in rec.out.num_scheduled_tokens)
    assert "r1" in readmitted.out.new_request_ids
    # Recompute covers prompt and earlier outputs; the prefix cache may serve its full blocks.
    computed, num_tokens = readmitted.before["r1"]
    assert num_tokens == 8 + len(outputs_so_far) and computed == readmitted.out.num_cached_tokens["r1"]
    d.assert_drained()


def test_fcfs_victim_is_by_arrival_not_by_position_in_the_running_list():
    d = Driver(make_scheduler(num_blocks=6, max_model_len=24, max_num_seqs=3, enable_prefix_caching=False))
    old = make_request("old", 8, 12, arrival_time=0.0)
    new = make_request("new", 8, 12, arrival_time=5.0)
    d.add(new)
    d.s.add_request(old)  # added later, but arrived first
    d.all_requests["old"] = old
    d.run()
    assert d.preempted and set(d.preempted) == {"new"}
    d.assert_drained()


def test_priority_preempts_the_least_important_then_most_recent():
    d = Driver(make_scheduler(num_blocks=8, max_model_len=32, max_num_seqs=3, policy="priority"))
    hi = make_request("hi", 8, 14, priority=0, arrival_time=2.0)
    lo = make_request("lo", 8, 14, priority=5, arrival_time=0.0)
    mid = make_request("mid", 8, 14, priority=1, arrival_time=1.0)
    d.add(hi, lo, mid)
    assert d.step().out.new_request_ids == ["hi", "mid", "lo"], "admitted by (priority, arrival)"
    while not d.preempted:
        d.step()
    assert d.preempted[0] == "lo", "the oldest request is still the least important"
    d.run()
    assert all(d.all_requests[rid].num_output_tokens == 14 for rid in ("hi", "lo", "mid"))
    assert "hi" not in d.preempted
    d.assert_drained()


def test_priority_waiting_order_and_ties_by_arrival():
    s = make_scheduler(policy="priority")
    for rid, prio, t in [("a", 2, 0.0), ("b", 1, 1.0), ("c", 1, 0.5), ("d", 0, 3.0)]:
        s.add_request(make_request(rid, 4, priority=prio, arrival_time=t))
    assert [r.request_id for r in s.waiting] == ["d", "c", "b", "a"]
    s.finish_request("c", RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in s.waiting] == ["d", "b", "a"]


def test_a_request_that_needs_blocks_and_is_the_victim_preempts_itself():
    d = Driver(make_scheduler(num_blocks=4, max_model_len=16, max_num_seqs=2))
    a = make_request("a", 6, 3, arrival_time=0.0)
    b = make_request("b", 8, 6, arrival_time=1.0)
    d.add(a, b)
    d.step()  # 2 blocks each; a's 7th token fits, b's 9th needs a third block
    assert d.kv.num_free_blocks == 0
    rec = d.step()
    assert rec.out.preempted_ids == ["b"] and rec.out.num_scheduled_tokens == {"a": 1}
    d.run()
    d.assert_drained()


def test_a_victim_scheduled_earlier_in_the_step_gives_its_budget_back():
    d = Driver(make_scheduler(num_blocks=6, max_model_len=24, max_num_seqs=2, enable_prefix_caching=False))
    young = make_request("young", 8, 12, arrival_time=9.0)
    old = make_request("old", 7, 12, arrival_time=0.0)
    d.add(young)
    d.step()  # young runs first and sits first in the running list
    d.add(old)
    d.run()
    for rec in d.steps:
        for rid in rec.out.preempted_ids:
            assert rid not in rec.out.num_scheduled_tokens and rid not in rec.out.new_block_ids
    assert "young" in d.preempted and "old" not in d.preempted
    d.assert_drained()


def test_budget_of_a_victim_scheduled_earlier_goes_to_later_requests():
    d = Driver(
        make_scheduler(
            num_blocks=6, max_model_len=24, max_num_seqs=3, max_num_batched_tokens=10, enable_prefix_caching=False
        )
    )
    young = make_request("young", 7, 10, arrival_time=9.0)
    d.add(young)
    d.step()  # young: 2 blocks, first in the running list although it arrived last
    old = make_request("old", 4, 10, arrival_time=0.0)
    c = make_request("c", 20, 2, arrival_time=1.0)
    d.add(old, c)
    assert d.step().out.num_scheduled_tokens == {"young": 1, "old": 4, "c": 5}
    # young takes the last free block; old then needs one and preempts young, whose token
    # returns to the budget: c's chunk is computed after that and gets all that is left.
    rec = d.step()
    assert rec.out.preempted_ids == ["young"]
    assert rec.out.num_scheduled_tokens == {"old": 1, "c": 9}
    d.run()
    d.assert_drained()


def test_no_admission_in_a_step_that_preempted_even_with_room():
    d = Driver(
        make_scheduler(
            num_blocks=5, max_model_len=20, max_num_seqs=2, max_num_batched_tokens=10, enable_prefix_caching=False
        )
    )
    young = make_request("young", 12, 5, arrival_time=9.0)
    d.add(young)
    d.step()
    d.add(make_request("old", 4, 5, arrival_time=0.0))
    assert d.step().out.num_scheduled_tokens == {"young": 2, "old": 4}
    rec = d.step()
    # young freed 4 blocks and old took 1: young's first chunk would fit again, but not this step.
    assert rec.out.preempted_ids == ["young"] and rec.out.num_scheduled_tokens == {"old": 1}
    assert d.kv.num_free_blocks == 3
    rec = d.step()
    assert rec.out.new_request_ids == ["young"] and rec.out.num_scheduled_tokens == {"old": 1, "young": 9}
    d.run()
    d.assert_drained()


# -- finish and abort --------------------------------------------------------------------------


def test_abort_frees_everything_running_or_waiting():
    d = Driver(make_scheduler(max_num_seqs=2, max_num_batched_tokens=8))
    a, b, c = make_requests(3, 12, 4)
    d.add(a, b, c)
    d.step()
    assert a.status == RequestStatus.RUNNING and c.status == RequestStatus.WAITING
    assert d.abort("r0") is a and a.status == RequestStatus.FINISHED_ABORTED and a.finish_reason == "abort"
    assert d.abort("r2") is c
    assert d.kv.get_block_ids("r0") == [] and d.abort("r0") is None
    d.run()
    assert b.status == RequestStatus.FINISHED_LENGTH
    d.assert_drained()


def test_abort_while_the_step_runs_is_ignored_by_the_update():
    s = make_scheduler()
    s.add_request(make_request("a", 6))
    out = s.schedule()
    runner_output = runner_output_for(s, out)
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    s.update_from_output(out, runner_output)
    assert s.kv_cache_manager.num_used_blocks == 0 and not s.has_unfinished_requests()
    s.kv_cache_manager.check_invariants()


def test_everything_finishes_under_a_tiny_pool_with_the_same_outputs():
    d = Driver(make_scheduler(num_blocks=5, block_size=BS, max_model_len=20, max_num_seqs=4, max_num_batched_tokens=12))
    d.add(*make_requests(6, 7, 9))
    d.run()
    assert d.preempted, "the pool is small enough to force preemptions"
    assert all(r.num_output_tokens == 9 for r in d.all_requests.values())
    d.assert_drained()
