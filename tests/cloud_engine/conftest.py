"""Factories for the cloud engine's scheduler and KV cache manager, driven without a model.

`Driver` plays the engine's part of a step (schedule -> "run" -> update -> stop
checks) with a fake runner whose sampled token depends only on the output
position, so a request recomputed after a preemption produces the same tokens.
Compile on and off: with TANDEM_CLOUD_COMPILE set (on, off or auto; the [cloud] compile setting's
own variable), every engine these tests build in-process runs under that mode instead of its
config's, and every server they start reads it as a setting. CI runs this folder once more with it
on (scripts/run-tests.sh); the main run has compile = auto, which is off.

The driver also keeps a model of the paged KV cache's cells: every scheduled chunk must
find exactly the request's earlier tokens in the blocks of its table, and may
write only into blocks nobody shares, so a prefix hit on the wrong block, a block
reused while still held, or a cached block overwritten all fail loudly.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import pytest

import cloud_engine.engine
from cloud_engine.block_manager import KVCacheManager
from cloud_engine.request import Request
from cloud_engine.scheduler import ModelRunnerOutput, PrefillAllowance, Scheduler, SchedulerOutput
from sdk.protocol.engine import SamplingParams
from sdk.protocol.request_status import RequestStatus


@pytest.fixture(autouse=True)
def cloud_compile_mode(monkeypatch):
    """Engines built in-process with compile = auto (the default) compile their decode steps as
    TANDEM_CLOUD_COMPILE says, where it is set; a test that asks for on or off gets it."""
    forced = os.environ.get("TANDEM_CLOUD_COMPILE")
    if forced:
        resolve = cloud_engine.engine.resolve_compile
        monkeypatch.setattr(
            cloud_engine.engine,
            "resolve_compile",
            lambda mode, *rest: resolve(forced if mode == "auto" else mode, *rest),
        )


BS = 4  # block size of the factories
FAKE_TOKEN_BASE = 100_000


def make_scheduler(**overrides) -> Scheduler:
    """A real scheduler over a real KV cache manager; any argument of either can be overridden."""
    config = dict(
        num_blocks=64,
        block_size=BS,
        enable_prefix_caching=True,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=64,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        policy="fcfs",
    )
    config.update(overrides)
    kv = KVCacheManager(config.pop("num_blocks"), config.pop("block_size"), config.pop("enable_prefix_caching"))
    return Scheduler(kv, **config)


def distinct_prompt(request_id: str, length: int) -> list[int]:
    """A prompt no other request id shares (deterministic across runs)."""
    base = zlib.crc32(request_id.encode()) % 1000 * 1000
    return [base + i for i in range(length)]


def make_request(
    request_id: str, prompt: list[int] | int, max_tokens: int = 4, priority: int = 0, arrival_time: float | None = None
) -> Request:
    if isinstance(prompt, int):
        prompt = distinct_prompt(request_id, prompt)
    extra = {} if arrival_time is None else {"arrival_time": arrival_time}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return Request(request_id, list(prompt), params, priority=priority, **extra)


def make_requests(n: int, prompt_len: int, max_tokens: int, prefix: str = "r", **kwargs) -> list[Request]:
    """`n` requests with distinct prompts, ids prefix0..prefix{n-1}, arriving in that order."""
    return [make_request(f"{prefix}{i}", prompt_len, max_tokens, arrival_time=float(i), **kwargs) for i in range(n)]


def fake_token(request: Request) -> int:
    """The 'sampled' token: a function of the output position only, so recompute agrees."""
    return FAKE_TOKEN_BASE + request.num_output_tokens


def runner_output_for(scheduler: Scheduler, out: SchedulerOutput, sample=fake_token) -> ModelRunnerOutput:
    """What a runner returns: one token for each scheduled request that catches up this step."""
    sampled = {}
    for rid, n in out.num_scheduled_tokens.items():
        request = scheduler.requests[rid]
        if request.num_computed_tokens + n == request.num_tokens:
            sampled[rid] = sample(request)
    return ModelRunnerOutput(sampled)


@dataclass
class StepRecord:
    out: SchedulerOutput
    before: dict[str, tuple[int, int]]  # scheduled id -> (num_computed_tokens, num_tokens) before the step
    sampled: list[str]
    finished: list[str]


class Driver:
    """Plays the engine around a real Scheduler and checks the books after every step."""

    def __init__(self, scheduler: Scheduler):
        self.s = scheduler
        self.kv = scheduler.kv_cache_manager
        self.pool = self.kv.pool
        self.cells: list[int | None] = [None] * (self.kv.num_blocks * self.kv.block_size)
        self.all_requests: dict[str, Request] = {}
        self.steps: list[StepRecord] = []
        self.preempted: list[str] = []

    def add(self, *requests: Request) -> None:
        for request in requests:
            self.s.add_request(request)
            self.all_requests[request.request_id] = request

    def abort(self, request_id: str) -> Request | None:
        request = self.s.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        self.check_state()
        return request

    def step(self, prefill: PrefillAllowance | None = None) -> StepRecord:
        s = self.s
        out = s.schedule(prefill)
        self.check_output(out)
        before = {
            rid: (s.requests[rid].num_computed_tokens, s.requests[rid].num_tokens) for rid in out.num_scheduled_tokens
        }
        for rid, n in out.num_scheduled_tokens.items():
            self.compute(s.requests[rid], n)
        runner_output = runner_output_for(s, out)
        s.update_from_output(out, runner_output)
        finished = []
        for rid in runner_output.sampled_token_ids:
            request = s.requests[rid]
            if request.num_output_tokens >= request.params.max_tokens or request.num_tokens > s.max_model_len:
                s.finish_request(rid, RequestStatus.FINISHED_LENGTH)
                finished.append(rid)
        self.preempted += out.preempted_ids
        record = StepRecord(out, before, list(runner_output.sampled_token_ids), finished)
        self.steps.append(record)
        self.check_state()
        return record

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.s.has_unfinished_requests():
                return
            self.step()
        raise AssertionError(f"not finished after {max_steps} steps: {self.s.num_unfinished} unfinished")

    def compute(self, request: Request, num_new: int) -> None:
        """The "forward pass": read the request's earlier KV through its table, write the new tokens' KV."""
        bs = self.kv.block_size
        table = self.kv.get_block_ids(request.request_id)
        start = request.num_computed_tokens
        for pos in range(start + num_new):
            block_id = table[pos // bs]
            cell = block_id * bs + pos % bs
            if pos < start:
                assert self.cells[cell] == request.all_token_ids[pos], (
                    f"{request.request_id}: block {block_id} holds {self.cells[cell]} at position {pos}, "
                    f"expected {request.all_token_ids[pos]}"
                )
            else:
                block = self.pool.blocks[block_id]
                assert block.ref_count == 1 and block.block_hash is None, (
                    f"{request.request_id} writes into block {block_id}, which is shared or cached"
                )
                self.cells[cell] = request.all_token_ids[pos]

    # -- checks ----------------------------------------------------------------------------

    def check_output(self, out: SchedulerOutput) -> None:
        s, bs = self.s, self.kv.block_size
        assert out.total_num_scheduled_tokens <= s.max_num_batched_tokens
        assert len(out.num_scheduled_tokens) <= s.max_num_seqs
        for rid, n in out.num_scheduled_tokens.items():
            r = s.requests[rid]
            assert n >= 1, f"{rid} scheduled {n} tokens"
            assert r.status == RequestStatus.RUNNING and r in s.running
            assert r.num_computed_tokens + n <= min(r.num_tokens, s.max_model_len)
            assert len(self.kv.get_block_ids(rid)) * bs >= r.num_computed_tokens + n
            if not s.enable_chunked_prefill:
                assert r.num_computed_tokens + n == r.num_tokens, f"{rid} got a partial prefill without chunking"
            if s.long_prefill_token_threshold and s.enable_chunked_prefill:
                assert n <= s.long_prefill_token_threshold
        for rid in out.new_request_ids:
            assert out.new_block_ids[rid] == self.kv.get_block_ids(rid)
            assert s.requests[rid].num_computed_tokens == out.num_cached_tokens[rid]
        for rid in out.preempted_ids:
            r = self.all_requests[rid]
            assert r.status == RequestStatus.PREEMPTED and r.num_computed_tokens == 0
            assert rid not in out.num_scheduled_tokens and r in s.waiting
            assert self.kv.get_block_ids(rid) == []
        if out.preempted_ids:
            assert not out.new_request_ids, "a step that preempted admitted new requests"

    def check_state(self) -> None:
        s, kv, bs = self.s, self.kv, self.kv.block_size
        kv.check_invariants()
        assert 0 <= kv.num_used_blocks <= kv.num_blocks
        assert len(s.running) <= s.max_num_seqs
        for r in s.running:
            assert r.status == RequestStatus.RUNNING
            assert len(kv.get_block_ids(r.request_id)) * bs >= r.num_computed_tokens
        for r in s.waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert r.num_computed_tokens == 0 and kv.get_block_ids(r.request_id) == []
        assert set(s.requests) == {r.request_id for r in s.running} | {r.request_id for r in s.waiting}
        assert s.num_unfinished == len(s.requests)
        # A published block's cells hold exactly the tokens its hash names, held or free.
        for block in self.pool.blocks:
            if block.block_hash is not None:
                cells = self.cells[block.block_id * bs : (block.block_id + 1) * bs]
                assert tuple(cells) == block.block_hash.token_ids, f"cached block {block.block_id} was overwritten"

    def assert_drained(self) -> None:
        s, kv = self.s, self.kv
        assert not s.has_unfinished_requests() and not s.requests
        assert kv.num_used_blocks == 0 and kv.num_free_blocks == kv.num_blocks
        assert sorted(self.pool.free_block_ids()) == list(range(kv.num_blocks))
        kv.check_invariants()
        for r in self.all_requests.values():
            assert r.status.is_finished
            if r.status == RequestStatus.FINISHED_LENGTH:
                assert r.output_token_ids == [FAKE_TOKEN_BASE + i for i in range(r.num_output_tokens)]
        assert s.schedule().is_empty
