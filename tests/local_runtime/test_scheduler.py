"""The local engine's scheduler, driven without a model.

A small simulator plays the engine's part of a step (schedule -> clear slots ->
copy prefixes -> "decode" -> on_step_done -> sample/finish). It also keeps a model
of llama.cpp's per-slot KV cells, so every step checks that each scheduled chunk
lands right after the cells its slot already holds, and that those cells hold
exactly the request's tokens: stale cells in a reused slot, a prefix copied from
the wrong slot, or a copy into an uncleared slot all fail loudly.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from local_runtime.block_manager import BlockManager
from local_runtime.request import Request, RequestStatus
from local_runtime.scheduler import Scheduler, SchedulerOutput
from sdk.protocol.engine import SamplingParams

BS = 4


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = BS,
    max_num_seqs: int = 4,
    budget: int = 32,
    cache: bool = False,
    max_cached: int | None = None,
    streams: bool = False,
) -> Scheduler:
    """Without the prompt cache unless asked: most tests pin what happens when a request lets go.
    `streams`: every slot owns its cells (llama.cpp's KV streams), so cached slots are taken over."""
    return Scheduler(
        BlockManager(num_blocks, block_size),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        cache_finished_prompts=cache,
        max_cached_prompts=max_cached,
        slots_own_their_cells=streams,
    )


def make_request(request_id: str, prompt: list[int] | int, max_tokens: int = 4) -> Request:
    if isinstance(prompt, int):
        prompt = [(hash(request_id) + i) % 50_000 for i in range(prompt)]
    return Request(request_id, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0))


def make_requests(*specs: tuple[int, int], prefix: str = "r") -> list[Request]:
    """One request per (prompt length, max_tokens), with distinct prompts."""
    return [make_request(f"{prefix}{i}", n, m) for i, (n, m) in enumerate(specs)]


def fake_token(request: Request) -> int:
    """The 'sampled' token: a function of the position only, so recompute after preemption agrees."""
    return 100_000 + request.num_output_tokens


@dataclass
class StepRecord:
    out: SchedulerOutput
    # Per scheduled request: (num_computed_tokens before the step, num_tokens before the step).
    before: dict[str, tuple[int, int]]
    sampled: list[str]
    finished: list[str]
    slots: dict[str, int]  # slot of every scheduled request during the step


class Sim:
    """Plays the engine around a real Scheduler and keeps a model of llama.cpp's slots."""

    def __init__(self, scheduler: Scheduler):
        self.s = scheduler
        self.bm = scheduler.block_manager
        self.num_slots = len(scheduler._free_slots)
        self.cells: dict[int, list[int]] = {slot: [] for slot in range(self.num_slots)}
        self.all_requests: dict[str, Request] = {}
        self.steps: list[StepRecord] = []
        self.preempted: list[str] = []
        self.copies_from_cache = 0
        self.takeovers = 0

    def add(self, *requests: Request) -> None:
        for request in requests:
            self.s.add_request(request)
            self.all_requests[request.request_id] = request

    def abort(self, request_id: str) -> Request | None:
        return self.s.finish_request(request_id, RequestStatus.FINISHED_ABORTED)

    def step(self, abort_mid_step: list[str] = ()) -> StepRecord:
        s = self.s
        out = s.schedule()
        self.check_output(out)
        # The engine applies memory ops first: clears, then prefix copies in order.
        for slot in out.cleared_slots:
            self.cells[slot] = []
        for src, dst, n in out.prefix_copies:
            assert len(self.cells[src]) >= n, (
                f"prefix copy of {n} tokens from slot {src} holding {len(self.cells[src])}"
            )
            if src == dst:  # a cached prompt's slot taken over: its first n cells stay, the rest go
                self.cells[dst] = self.cells[dst][:n]
                continue
            assert self.cells[dst] == [], f"prefix copy into slot {dst}, which still holds stale cells"
            self.cells[dst] = list(self.cells[src][:n])
        # The "decode": every chunk must extend its slot's cells contiguously with the right tokens.
        before = {}
        slots = {rid: s.requests[rid].slot for rid in out.num_scheduled_tokens}
        for rid, n in out.num_scheduled_tokens.items():
            r = s.requests[rid]
            before[rid] = (r.num_computed_tokens, r.num_tokens)
            start = r.num_computed_tokens
            assert self.cells[r.slot] == r.all_token_ids[:start], (
                f"{rid}: slot {r.slot} holds {self.cells[r.slot]} but the request computed {r.all_token_ids[:start]}"
            )
            self.cells[r.slot].extend(r.all_token_ids[start : start + n])
        for rid in abort_mid_step:  # an abort that lands while the decode runs
            if rid in s.requests:
                self.abort(rid)
        s.on_step_done(out)
        sampled, finished = [], []
        for rid in out.num_scheduled_tokens:
            r = s.requests.get(rid)
            if r is None or r.num_computed_tokens != r.num_tokens:
                continue
            r.append_output_token(fake_token(r))
            sampled.append(rid)
            if r.num_output_tokens >= r.params.max_tokens:
                s.finish_request(rid, RequestStatus.FINISHED_LENGTH)
                finished.append(rid)
        self.preempted += out.preempted_ids
        record = StepRecord(out, before, sampled, finished, slots)
        self.steps.append(record)
        self.check_state()
        return record

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.s.num_unfinished:
                return
            self.step()
        raise AssertionError(f"not finished after {max_steps} steps: {self.s.num_unfinished} unfinished")

    # -- checks ----------------------------------------------------------------------------

    def check_output(self, out: SchedulerOutput) -> None:
        s, bs = self.s, self.bm.block_size
        assert out.total_num_scheduled_tokens <= s.max_num_batched_tokens
        running_slots = {r.slot for r in s.running}
        cached_slots = {entry.slot for entry in s.prompt_cache}
        for rid, n in out.num_scheduled_tokens.items():
            r = s.requests[rid]
            assert n >= 1, f"{rid} scheduled {n} tokens"
            assert r.status == RequestStatus.RUNNING and r in s.running
            assert r.num_computed_tokens + n <= r.num_tokens
            # Its blocks cover what it will have computed after this step.
            assert len(self.bm.block_table(rid)) * bs >= r.num_computed_tokens + n
        assert len(set(out.cleared_slots)) == len(out.cleared_slots)
        for src, dst, n in out.prefix_copies:
            assert src in running_slots | cached_slots and dst in running_slots
            dst_req = next(r for r in s.running if r.slot == dst)
            assert 0 < n < dst_req.num_tokens and dst_req.num_computed_tokens == n
            if src == dst:  # taken over: only where slots own their cells, and the entry is gone
                assert s.slots_own_their_cells and dst not in cached_slots
                self.takeovers += 1
                continue
            self.copies_from_cache += src in cached_slots
            # Where slots own their cells a cached prompt is taken over, never copied from, unless
            # an earlier admission of this step copied from it already.
            src_key = next((r.request_id for r in s.running if r.slot == src), None)
            src_key = src_key or next(e.key for e in s.prompt_cache if e.slot == src)
            # The books share the full blocks only; a partial tail's cells are shared in llama.cpp
            # while the newcomer books a block of its own for them (an upper bound stays one).
            assert self.bm.block_table(dst_req.request_id)[: n // bs] == self.bm.block_table(src_key)[: n // bs]
        for rid in out.preempted_ids:
            r = self.all_requests[rid]
            assert r.status == RequestStatus.PREEMPTED and r.slot is None and r.num_computed_tokens == 0
            assert rid not in out.num_scheduled_tokens and r in s.waiting
            assert self.bm.block_table(rid) == []

    def check_state(self) -> None:
        s, bm = self.s, self.bm
        bm.check_invariants()
        assert 0 <= bm.num_used_blocks <= bm.num_blocks
        slots = [r.slot for r in s.running] + [entry.slot for entry in s.prompt_cache]
        assert None not in slots
        assert len(set(slots)) == len(slots), f"two running requests or cached prompts share a slot: {slots}"
        assert not set(slots) & set(s._free_slots)
        assert sorted(slots + list(s._free_slots)) == list(range(self.num_slots))
        assert len(s.running) <= self.num_slots
        for r in s.running:
            assert r.status == RequestStatus.RUNNING
        for r in s.waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert r.slot is None and bm.block_table(r.request_id) == []
        held = {rid for rid in s.requests if bm.block_table(rid)}
        assert held <= {r.request_id for r in s.running}, "a request that is not running holds blocks"
        assert set(s.requests) == {r.request_id for r in s.running} | {r.request_id for r in s.waiting}
        for entry in s.prompt_cache:  # a cached prompt's slot still holds its computed tokens (an abort
            # mid-step leaves that step's chunk after them, never copied: copies stop at num_computed_tokens)
            n = entry.num_computed_tokens
            assert self.cells[entry.slot][:n] == entry.all_token_ids[:n]
            assert len(bm.block_table(entry.key)) * bm.block_size >= entry.num_computed_tokens

    def assert_drained(self) -> None:
        s, bm = self.s, self.bm
        assert s.num_unfinished == 0 and not s.requests
        assert bm.num_free_blocks + s.num_cached_blocks == bm.num_blocks  # nothing leaked: the cache holds the rest
        cached_slots = {entry.slot for entry in s.prompt_cache}
        cleared = s.clear_prompt_cache()
        assert cached_slots <= set(cleared)
        for slot in cleared:
            self.cells[slot] = []
        assert bm.num_free_blocks == bm.num_blocks
        assert bm._hashed == {}
        assert sorted(s._free_slots) == list(range(self.num_slots))
        bm.check_invariants()
        for r in self.all_requests.values():
            assert r.status.is_finished and r.slot is None
            if r.status == RequestStatus.FINISHED_LENGTH:
                assert r.output_token_ids == [100_000 + i for i in range(r.params.max_tokens)]
        # Slots released at the very end are cleared by the next (empty) schedule.
        out = s.schedule()
        assert not out.num_scheduled_tokens and not out.prefix_copies
        assert s.schedule().is_empty


# -- basics --------------------------------------------------------------------------------


def test_single_request_prefill_then_decodes():
    sim = Sim(make_scheduler(budget=32))
    (r,) = make_requests((10, 5))
    sim.add(r)
    rec = sim.step()
    assert rec.out.num_scheduled_tokens == {"r0": 10}
    assert rec.sampled == ["r0"] and r.num_output_tokens == 1
    for _ in range(4):
        rec = sim.step()
        assert rec.out.num_scheduled_tokens == {"r0": 1}
    assert r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 5
    assert r.finish_reason == "length"
    sim.assert_drained()


def test_duplicate_request_id_rejected_and_unknown_finish_is_none():
    s = make_scheduler()
    s.add_request(make_request("a", 4))
    with pytest.raises(ValueError):
        s.add_request(make_request("a", 4))
    assert s.finish_request("nope", RequestStatus.FINISHED_ABORTED) is None


def test_empty_schedule_when_idle():
    s = make_scheduler()
    out = s.schedule()
    assert out.is_empty and out.total_num_scheduled_tokens == 0


def test_token_budget_respected_every_step_and_decodes_are_one_token():
    budget = 16
    sim = Sim(make_scheduler(num_blocks=64, max_num_seqs=6, budget=budget))
    sim.add(*make_requests((30, 6), (5, 9), (17, 3), (1, 7), (12, 12), (40, 2), (3, 5), (8, 8)))
    sim.run()
    for rec in sim.steps:
        assert rec.out.total_num_scheduled_tokens <= budget
        for rid, n in rec.out.num_scheduled_tokens.items():
            computed, num_tokens = rec.before[rid]
            if computed >= sim.all_requests[rid].num_prompt_tokens:
                assert n == 1, f"{rid} decoded {n} tokens in one step"
    # The budget was used fully whenever there was more prefill work than budget.
    assert any(rec.out.total_num_scheduled_tokens == budget for rec in sim.steps)
    assert not sim.preempted
    sim.assert_drained()


def test_long_prompt_is_chunked_by_the_budget():
    sim = Sim(make_scheduler(num_blocks=64, budget=16))
    (r,) = make_requests((40, 3))
    sim.add(r)
    chunks = [sim.step().out.num_scheduled_tokens["r0"] for _ in range(3)]
    assert chunks == [16, 16, 8]
    assert r.num_output_tokens == 1  # sampled only once the whole prompt was computed
    assert [sim.step().out.num_scheduled_tokens["r0"] for _ in range(2)] == [1, 1]
    sim.assert_drained()


def test_no_sample_before_the_prompt_is_computed():
    sim = Sim(make_scheduler(num_blocks=64, budget=8))
    (r,) = make_requests((20, 2))
    sim.add(r)
    assert sim.step().sampled == [] and sim.step().sampled == []
    assert sim.step().sampled == ["r0"]
    sim.run()
    sim.assert_drained()


def test_running_decodes_go_before_new_prefills():
    sim = Sim(make_scheduler(num_blocks=64, max_num_seqs=4, budget=10))
    a, b = make_requests((4, 10), (30, 2))
    sim.add(a)
    sim.step()
    sim.add(b)
    rec = sim.step()
    # a's decode token is scheduled first; b's prefill gets the rest of the budget.
    assert rec.out.num_scheduled_tokens == {"r0": 1, "r1": 9}
    sim.run()
    sim.assert_drained()


def test_continuous_batching_new_requests_join_as_others_finish():
    sim = Sim(make_scheduler(num_blocks=64, max_num_seqs=2, budget=64))
    reqs = make_requests((4, 2), (4, 8), (4, 3), (4, 3))
    sim.add(*reqs)
    rec = sim.step()
    assert set(rec.out.num_scheduled_tokens) == {"r0", "r1"}  # only 2 slots
    assert [r.request_id for r in sim.s.waiting] == ["r2", "r3"]
    rec = sim.step()
    assert rec.finished == ["r0"]
    rec = sim.step()
    # r2 joins while r1 is still decoding, in r0's old slot (cleared first).
    assert rec.out.num_scheduled_tokens == {"r1": 1, "r2": 4}
    assert reqs[2].slot in rec.out.cleared_slots
    sim.run()
    sim.assert_drained()
    joined = [i for i, rec in enumerate(sim.steps) if "r3" in rec.out.num_scheduled_tokens]
    assert any("r1" in sim.steps[i].out.num_scheduled_tokens for i in joined), "r3 never ran beside r1"


def test_admission_waits_for_free_blocks():
    # 4 blocks of 4 = 16 cells. a: 12-token prompt, 2 outputs -> up to 13 tokens = 4 blocks.
    sim = Sim(make_scheduler(num_blocks=4, max_num_seqs=4, budget=64))
    a, b = make_requests((12, 3), (8, 2))
    sim.add(a, b)
    rec = sim.step()
    # b needs 2 blocks, only 1 is free: it waits (all or nothing), a runs alone.
    assert rec.out.num_scheduled_tokens == {"r0": 12}
    assert b.status == RequestStatus.WAITING and sim.bm.block_table("r1") == []
    while a.status == RequestStatus.RUNNING:
        free_before = sim.bm.num_free_blocks
        rec = sim.step()
        if "r1" in rec.out.num_scheduled_tokens:
            break
        assert free_before < 2 or a.status != RequestStatus.RUNNING
    sim.run()
    assert b.status == RequestStatus.FINISHED_LENGTH
    assert not sim.preempted
    sim.assert_drained()


# -- preemption ----------------------------------------------------------------------------


def test_preemption_when_pool_runs_out_newest_goes_first_and_recomputes():
    # 6 blocks of 4 = 24 cells; each request grows to 8 + 9 = 17 tokens (5 blocks).
    sim = Sim(make_scheduler(num_blocks=6, max_num_seqs=2, budget=64))
    a, b, c = make_requests((8, 10), (8, 10), (4, 2))
    sim.add(a, b, c)
    rec = sim.step()
    assert set(rec.out.num_scheduled_tokens) == {"r0", "r1"} and c.status == RequestStatus.WAITING
    b_slot = b.slot
    while not sim.preempted:
        rec = sim.step()
    assert rec.out.preempted_ids == ["r1"], "the newest running request is the victim"
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.slot is None
    assert b_slot in rec.out.cleared_slots, "the victim's cells are cleared in the same step"
    assert [r.request_id for r in sim.s.waiting] == ["r1", "r2"], "requeued at the front"
    assert "r0" in rec.out.num_scheduled_tokens  # the older one kept going
    assert sim.s.num_preemptions_total == 1
    outputs_at_preemption = list(b.output_token_ids)
    assert outputs_at_preemption, "b had produced outputs before it was preempted"
    # No admission in the step that preempted.
    assert set(rec.out.num_scheduled_tokens) == {"r0"}
    sim.run()
    # b recomputed prompt + earlier outputs and still produced every output exactly once.
    assert b.status == RequestStatus.FINISHED_LENGTH
    assert b.output_token_ids[: len(outputs_at_preemption)] == outputs_at_preemption
    assert b.num_cached_tokens == 0  # set at first admission only
    p = next(i for i, rec in enumerate(sim.steps) if rec.out.preempted_ids)
    readmitted = next(rec for rec in sim.steps[p + 1 :] if "r1" in rec.out.num_scheduled_tokens)
    assert readmitted.before["r1"] == (0, 8 + len(outputs_at_preemption)), "recompute from scratch"
    sim.assert_drained()


def test_a_request_preempts_itself_when_it_is_the_newest():
    # a and b both decoding; b (newest) is the one that cannot grow: b preempts itself, not a.
    sim = Sim(make_scheduler(num_blocks=4, max_num_seqs=2, budget=64))
    a, b = make_requests((6, 3), (8, 6))
    sim.add(a, b)
    sim.step()  # 2 blocks each, pool full. a's 7th token fits its blocks; b's 9th needs a third.
    assert sim.bm.num_free_blocks == 0
    rec = sim.step()
    assert rec.out.preempted_ids == ["r1"]
    assert rec.out.num_scheduled_tokens == {"r0": 1}
    assert a.status == RequestStatus.RUNNING
    sim.run()
    sim.assert_drained()


def test_preempted_request_is_not_scheduled_in_the_step_that_preempts_it():
    sim = Sim(make_scheduler(num_blocks=5, max_num_seqs=3, budget=64))
    a, b = make_requests((4, 12), (4, 12))
    sim.add(a, b)
    sim.run()
    assert sim.preempted
    for rec in sim.steps:
        for rid in rec.out.preempted_ids:
            assert rid not in rec.out.num_scheduled_tokens
    sim.assert_drained()


# -- prefix sharing ------------------------------------------------------------------------


def test_prefix_sharing_copies_the_common_prefix_and_books_its_full_blocks():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=4, budget=64))
    common = list(range(1, 11))  # 10 tokens: 2 full blocks + 2
    a = make_request("a", common + [50, 51], max_tokens=6)
    sim.add(a)
    sim.step()  # a's prompt is computed and published
    b = make_request("b", common + [60, 61, 62], max_tokens=3)
    sim.add(b)
    rec = sim.step()
    # All 10 common tokens' cells (llama-server's prompt cache reuses a slot's common prefix
    # token by token too); the books share the 2 full blocks, and b books its own third.
    assert rec.out.prefix_copies == [(a.slot, b.slot, 10)]
    assert b.num_cached_tokens == 10
    assert rec.before["b"] == (10, 13) and rec.out.num_scheduled_tokens["b"] == 3
    shared = sim.bm.block_table("a")[:2]
    assert sim.bm.block_table("b")[:2] == shared
    assert all(sim.bm.blocks[i].ref_count == 2 for i in shared)
    assert all(sim.bm.blocks[i].holders == {"a", "b"} for i in shared)
    assert sim.bm.blocks[sim.bm.block_table("a")[2]].ref_count == 1
    assert sim.bm.block_table("b")[2] != sim.bm.block_table("a")[2]
    assert sim.s.num_prefix_cache_hit_tokens_total == 10
    sim.run()
    sim.assert_drained()


def test_identical_prompt_never_shares_its_last_token():
    sim = Sim(make_scheduler(num_blocks=32, budget=64))
    prompt = list(range(1, 9))  # exactly 2 blocks
    a = make_request("a", prompt, max_tokens=4)
    sim.add(a)
    sim.step()
    b = make_request("b", prompt, max_tokens=2)
    sim.add(b)
    rec = sim.step()
    # All but the last prompt token: it must be computed for b's logits.
    assert rec.out.prefix_copies == [(a.slot, b.slot, 7)]
    assert rec.out.num_scheduled_tokens["b"] == 1
    sim.run()
    sim.assert_drained()


def test_a_prefix_shorter_than_a_block_is_shared_from_a_running_request():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=4, budget=64))
    a = make_request("a", [1, 2, 3, 7, 7], max_tokens=6)
    sim.add(a)
    sim.step()
    b = make_request("b", [1, 2, 3, 8, 8, 8], max_tokens=2)
    c = make_request("c", [9, 2, 3, 8], max_tokens=2)  # nothing in common at position 0
    sim.add(b, c)
    rec = sim.step()
    assert rec.out.prefix_copies == [(a.slot, b.slot, 3)]
    assert rec.before["b"] == (3, 6) and rec.before["c"] == (0, 4)
    assert sim.bm.block_table("b")[0] != sim.bm.block_table("a")[0]  # booked as b's own
    sim.run()
    sim.assert_drained()


def test_a_prefix_is_shared_only_as_far_as_the_source_has_computed():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=4, budget=6))
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], max_tokens=2)
    sim.add(a)
    sim.step()  # a computed 6 of its 10 prompt tokens
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9, 11], max_tokens=2)
    sim.add(b)
    rec = sim.step()  # a takes 4 (its last chunk); b may share only the 6 already in a's cells
    assert rec.out.prefix_copies == [(a.slot, b.slot, 6)]
    sim.run()
    sim.assert_drained()


def test_shared_prefix_outlives_its_first_owner():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=4, budget=64))
    common = list(range(1, 9))
    a = make_request("a", common + [1], max_tokens=1)  # finishes after its first step
    sim.add(a)
    sim.step()
    assert a.status == RequestStatus.FINISHED_LENGTH and sim.bm.num_free_blocks == 32
    b = make_request("b", common + [2], max_tokens=5)
    sim.add(b)
    rec = sim.step()
    assert rec.out.prefix_copies == []  # a's blocks went back with it
    sim.step()
    c = make_request("c", common + [3], max_tokens=2)
    d = make_request("d", common + [4], max_tokens=2)
    sim.add(c, d)
    rec = sim.step()
    # c copies from b; d from b or from c (whose copy comes first in the list).
    assert rec.out.prefix_copies[0] == (b.slot, c.slot, 8)
    assert rec.out.prefix_copies[1][1:] == (d.slot, 8) and rec.out.prefix_copies[1][0] in (b.slot, c.slot)
    shared = sim.bm.block_table("b")[:2]
    assert all(sim.bm.blocks[i].ref_count == 3 for i in shared)
    sim.abort("b")  # the first holder leaves; c and d keep the blocks
    assert all(sim.bm.blocks[i].holders == {"c", "d"} for i in shared)
    sim.run()
    sim.assert_drained()


def test_cleared_slot_precedes_a_prefix_copy_into_it():
    """A finished request's slot is cleared in the next schedule, before a copy may reuse it."""
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=2, budget=64))
    common = list(range(1, 9))
    a = make_request("a", [7, 7, 7, 7, 7], max_tokens=1)  # slot 0, finishes at once
    c = make_request("c", common + [9], max_tokens=8)  # slot 1, long-lived prefix source
    sim.add(a, c)
    rec = sim.step()
    a_slot = rec.slots["a"]
    assert rec.finished == ["a"]
    b = make_request("b", common + [5, 5], max_tokens=2)
    sim.add(b)
    rec = sim.step()
    assert b.slot == a_slot
    assert a_slot in rec.out.cleared_slots
    assert rec.out.prefix_copies == [(c.slot, b.slot, 8)]
    sim.run()
    sim.assert_drained()


# -- releasing slots -----------------------------------------------------------------------


def test_finished_and_aborted_slots_are_cleared_by_the_next_schedule():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=3, budget=64))
    a, b, c, w = make_requests((4, 1), (4, 10), (4, 10), (4, 10))
    sim.add(a, b, c)
    rec = sim.step()
    slots = {r.request_id: r.slot for r in (b, c)}
    assert rec.finished == ["r0"]
    a_slot = rec.slots["r0"]
    rec = sim.step()
    assert rec.out.cleared_slots == [a_slot]
    rec = sim.step()
    assert rec.out.cleared_slots == []
    # Abort a running request between steps.
    sim.abort("r1")
    assert b.status == RequestStatus.FINISHED_ABORTED and b.finish_reason == "abort"
    assert sim.bm.block_table("r1") == []
    rec = sim.step()
    assert rec.out.cleared_slots == [slots["r1"]]
    # Abort a waiting request: it never had a slot, nothing to clear.
    sim.add(w)
    sim.abort("r3")
    assert w.status == RequestStatus.FINISHED_ABORTED
    rec = sim.step()
    assert rec.out.cleared_slots == []
    # Abort while a step runs: on_step_done skips it, the slot is cleared next step.
    rec = sim.step(abort_mid_step=["r2"])
    assert "r2" in rec.out.num_scheduled_tokens and c.status == RequestStatus.FINISHED_ABORTED
    rec = sim.step()
    assert rec.out.cleared_slots == [slots["r2"]]
    sim.assert_drained()


def test_abort_preempted_request():
    sim = Sim(make_scheduler(num_blocks=6, max_num_seqs=2, budget=64))
    a, b = make_requests((8, 10), (8, 10))
    sim.add(a, b)
    while not sim.preempted:
        sim.step()
    assert b.status == RequestStatus.PREEMPTED
    assert sim.abort("r1") is b and b.status == RequestStatus.FINISHED_ABORTED
    sim.run()
    assert a.status == RequestStatus.FINISHED_LENGTH
    sim.assert_drained()


# -- the prompt cache: finished requests keep their cells until they are needed ------------


def test_a_chats_next_turn_copies_the_finished_turn_from_its_slot():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=2, budget=64, cache=True))
    turn1 = make_request("t1", list(range(1, 11)), max_tokens=3)
    sim.add(turn1)
    sim.run()
    entry = next(iter(sim.s.prompt_cache))
    # The prompt and the first two answer tokens have cells; the last sampled token never ran.
    assert entry.num_computed_tokens == 12
    assert sim.s.num_cached_blocks == 3 and sim.bm.num_free_blocks == 29
    turn2 = make_request("t2", turn1.all_token_ids + [40, 41, 42], max_tokens=2)
    sim.add(turn2)
    rec = sim.step()
    assert rec.out.prefix_copies == [(entry.slot, turn2.slot, 12)]
    assert rec.out.num_scheduled_tokens == {"t2": 4} and turn2.num_cached_tokens == 12  # turn 1's last token, then 3
    sim.run()
    sim.assert_drained()


def test_cached_prompts_give_way_least_recent_first_to_a_request_that_needs_the_room():
    sim = Sim(make_scheduler(num_blocks=6, max_num_seqs=4, budget=64, cache=True))
    a, b = make_requests((7, 2), (7, 2))  # 8 computed cells each: 2 blocks
    sim.add(a)
    sim.run()
    sim.add(b)
    sim.run()
    slot_a, slot_b = (entry.slot for entry in sim.s.prompt_cache)
    assert sim.bm.num_free_blocks == 2
    c = make_request("c", 11, max_tokens=2)  # needs 3 blocks: a's entry (the older) goes
    sim.add(c)
    rec = sim.step()
    assert rec.out.cleared_slots == [slot_a] and rec.out.preempted_ids == []
    assert [entry.slot for entry in sim.s.prompt_cache] == [slot_b]
    sim.run()
    sim.assert_drained()


def test_a_cached_prompt_is_evicted_before_a_running_request_is_preempted():
    sim = Sim(make_scheduler(num_blocks=5, max_num_seqs=2, budget=64, cache=True))
    a = make_request("a", 7, max_tokens=2)
    sim.add(a)
    sim.run()
    (entry,) = sim.s.prompt_cache
    b = make_request("b", 8, max_tokens=10)  # grows from 2 blocks to 5: needs the cached 2
    sim.add(b)
    sim.run()
    assert sim.preempted == [] and b.num_output_tokens == 10
    assert any(entry.slot in rec.out.cleared_slots for rec in sim.steps)
    sim.assert_drained()


def test_a_prompt_whose_only_room_is_its_own_cached_prefix_is_computed_from_scratch():
    sim = Sim(make_scheduler(num_blocks=4, max_num_seqs=2, budget=64, cache=True))
    a = make_request("a", list(range(1, 9)), max_tokens=5)  # 12 computed cells: 3 blocks cached
    sim.add(a)
    sim.run()
    b = make_request("b", list(range(1, 9)) + [60] * 7, max_tokens=2)  # 16 cells: all 4 blocks
    sim.add(b)
    rec = sim.step()  # sharing a's 2 full prefix blocks would still need 3 more of the 1 free
    assert rec.out.prefix_copies == [] and rec.out.num_scheduled_tokens == {"b": 15}
    assert len(sim.s.prompt_cache) == 0
    sim.run()
    sim.assert_drained()


def test_at_most_max_cached_prompts_stay_the_most_recent():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=4, budget=64, cache=True, max_cached=2))
    s = sim.s
    a, b, c = make_requests((5, 1), (5, 1), (5, 1))
    for r in (a, b, c):
        sim.add(r)
        sim.run()
    assert [e.all_token_ids for e in s.prompt_cache] == [b.all_token_ids, c.all_token_ids]
    sim.assert_drained()


def test_every_slot_held_by_cached_prompts_still_admits():
    sim = Sim(make_scheduler(num_blocks=32, max_num_seqs=2, budget=64, cache=True))
    a, b, c = make_requests((5, 1), (5, 1), (5, 1))
    sim.add(a, b)
    sim.run()
    assert len(sim.s.prompt_cache) == 2 and not sim.s._free_slots
    sim.add(c)
    rec = sim.step()
    assert "r2" in rec.out.num_scheduled_tokens and len(rec.out.cleared_slots) == 1
    sim.run()
    sim.assert_drained()


# -- property: random workloads ------------------------------------------------------------


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4]))
    num_blocks = draw(st.integers(2, 16))
    capacity = num_blocks * block_size
    max_num_seqs = draw(st.integers(1, 4))
    budget = draw(st.integers(1, 24))
    prefixes = [draw(st.lists(st.integers(0, 3), min_size=0, max_size=10)) for _ in range(2)]
    specs = []
    for i in range(draw(st.integers(1, 8))):
        # Every request must fit the pool alone: prompt + max_tokens - 1 cells at most
        # (the last sampled token is never computed). Larger ones are the engine's to reject.
        max_tokens = draw(st.integers(1, min(8, capacity)))
        prefix = draw(st.sampled_from(prefixes))
        suffix = draw(st.lists(st.integers(0, 3), min_size=1, max_size=12))
        prompt = (prefix + suffix)[: capacity - max_tokens + 1]
        arrival = draw(st.integers(0, 12))
        abort_at = draw(st.one_of(st.none(), st.integers(0, 30)))
        mid_step = draw(st.booleans())
        specs.append((f"q{i}", prompt, max_tokens, arrival, abort_at, mid_step))
    return (
        block_size,
        num_blocks,
        max_num_seqs,
        budget,
        specs,
        draw(st.booleans()),
        draw(st.sampled_from([None, 0, 1, 2])),
        draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_finish_and_keep_the_books(workload):
    block_size, num_blocks, max_num_seqs, budget, specs, cache, max_cached, streams = workload
    sim = Sim(
        make_scheduler(
            num_blocks=num_blocks,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            budget=budget,
            cache=cache,
            max_cached=max_cached,
            streams=streams,
        )
    )
    pending = sorted(specs, key=lambda spec: spec[3])
    step = 0
    max_steps = 2_000
    while pending or sim.s.num_unfinished:
        assert step < max_steps, f"no progress: {sim.s.num_unfinished} unfinished after {max_steps} steps"
        while pending and pending[0][3] <= step:
            rid, prompt, max_tokens, *_ = pending.pop(0)
            sim.add(Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0)))
        mid = [rid for rid, *_, abort_at, m in specs if abort_at == step and m]
        for rid, *_, abort_at, m in specs:
            if abort_at == step and not m and rid in sim.s.requests:
                sim.abort(rid)
        sim.step(abort_mid_step=mid)
        step += 1
    for r in sim.all_requests.values():
        assert r.status in (RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)
        if r.status == RequestStatus.FINISHED_LENGTH:
            assert r.num_output_tokens == r.params.max_tokens
    assert len(sim.all_requests) == len(specs)
    event(f"preempted: {bool(sim.preempted)}")
    event(f"prefix copies: {any(rec.out.prefix_copies for rec in sim.steps)}")
    event(f"aborted: {any(r.status == RequestStatus.FINISHED_ABORTED for r in sim.all_requests.values())}")
    event(f"copied from a cached prompt: {sim.copies_from_cache > 0}")
    event(f"took a cached prompt's slot over: {sim.takeovers > 0}")
    sim.assert_drained()


# -- slots that own their cells (llama.cpp's KV streams) -----------------------------------


def test_slots_are_handed_out_lowest_first():
    sim = Sim(make_scheduler(num_blocks=64, max_num_seqs=4, budget=64, streams=True))
    a, b, c = make_requests((5, 1), (5, 8), (5, 8))
    sim.add(a, b, c)
    rec = sim.step()
    assert rec.slots == {"r0": 0, "r1": 1, "r2": 2}
    d = make_request("d", 5, max_tokens=2)
    sim.add(d)
    rec = sim.step()  # a's slot 0 came back; d takes it rather than slot 3
    assert rec.slots["d"] == 0 and 0 in rec.out.cleared_slots
    sim.run()
    sim.assert_drained()


def test_a_cached_prompt_is_taken_over_in_its_slot_not_copied():
    """Where a prefix copy would copy a whole stream, the newcomer takes the cached slot itself:
    its first cells stay, the rest are dropped, and the entry is gone; the pool's unified layout
    keeps copying (and the entry)."""
    common = list(range(1, 10))
    for streams in (True, False):
        sim = Sim(make_scheduler(num_blocks=64, max_num_seqs=4, budget=64, cache=True, streams=streams))
        a = make_request("a", common + [20, 21], max_tokens=3)
        sim.add(a)
        sim.run()
        (entry,) = sim.s.prompt_cache
        b = make_request("b", common + [30], max_tokens=2)
        sim.add(b)
        rec = sim.step()
        if streams:
            assert rec.out.prefix_copies == [(entry.slot, entry.slot, 9)] and rec.slots["b"] == entry.slot
            assert entry.slot not in rec.out.cleared_slots
        else:
            assert rec.out.prefix_copies == [(entry.slot, rec.slots["b"], 9)] and rec.slots["b"] != entry.slot
        sim.run()
        sim.assert_drained()


def test_a_cached_prompt_is_preferred_to_an_equally_long_running_source():
    common = list(range(1, 10))
    sim = Sim(make_scheduler(num_blocks=64, max_num_seqs=4, budget=64, cache=True, streams=True))
    sim.add(make_request("done-1", common + [20], max_tokens=1), make_request("done-2", common + [19], max_tokens=1))
    sim.run()
    assert len(sim.s.prompt_cache) == 2
    running = make_request("running", common + [21], max_tokens=20)
    sim.add(running)
    rec = sim.step()  # takes one cached slot over
    assert len(sim.s.prompt_cache) == 1 and rec.out.prefix_copies == [(rec.slots["running"],) * 2 + (9,)]
    (entry,) = sim.s.prompt_cache
    newcomer = make_request("new", common + [22], max_tokens=2)
    sim.add(newcomer)
    rec = sim.step()  # the running request's 9 tokens would be a stream copy; the cached slot is taken over
    assert rec.out.prefix_copies == [(entry.slot, entry.slot, 9)] and rec.slots["new"] == entry.slot
    sim.run()
    sim.assert_drained()


def test_a_take_over_the_pool_cannot_hold_gives_the_slot_back():
    """The pool is short even with the entry's blocks: the entry is gone (as eviction would have
    done), its slot is freed and cleared, and nothing leaks; the newcomer waits."""
    common = list(range(1, 9))
    sim = Sim(make_scheduler(num_blocks=8, max_num_seqs=3, budget=64, cache=True, streams=True))
    cached = make_request("cached", common + [7], max_tokens=1)
    sim.add(cached)
    sim.run()
    (entry,) = sim.s.prompt_cache
    hog = make_request("hog", 20, max_tokens=8)  # 5 of the 8 blocks now, 7 by its end
    sim.add(hog)
    sim.step()
    big = make_request("big", common + [9] * 8, max_tokens=4)  # needs 5 blocks; 3 free + the entry's 1 after sharing 2
    sim.add(big)
    rec = sim.step()
    assert "big" not in rec.out.num_scheduled_tokens and len(sim.s.prompt_cache) == 0
    assert entry.slot in sim.s._free_slots
    sim.run()
    sim.assert_drained()
