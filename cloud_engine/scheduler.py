"""Token-budget scheduler of the cloud engine: every request's computed tokens catch up with its tokens.

Each step gives requests tokens under one budget (`max_num_batched_tokens`) and at
most `max_num_seqs` requests: running requests first (1 token for a decode, a
chunk for a prompt still being prefilled), then waiting ones in queue order, each
after a prefix-cache lookup, while budget, sequence slots and KV blocks last. A
long prompt is split over steps beside the running decodes (chunked prefill).
A decoding request that carries a speculative draft (Request.spec_token_ids) is given
its draft tokens too, inside the same budget: num_computed_tokens catches up with
num_tokens + the draft, and tokens the target rejects are rolled back in
`update_from_output` (computed count lowered, blocks taken for them freed).
A draft is a guess, and may come from a caller (spec_decode.outside_drafts), so it takes
what the running requests' own tokens left over, before new requests are admitted: at most
its request's fair share of the step (max(max_draft_tokens + 1, budget / running requests)
tokens, the request's own token included), and only KV blocks that are free: a draft never
preempts. When a running request cannot get blocks for its own tokens, the least deserving
running request is preempted: its blocks are freed and it is recomputed later from its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cloud_engine.block_manager import KVCacheManager
from cloud_engine.request import Request
from cloud_engine.waiting_queue import WaitingQueue
from sdk.protocol.drafts import MAX_DRAFT_TOKENS
from sdk.protocol.request_status import RequestStatus

POLICIES = ("fcfs", "priority")


class PrefillAllowance(Protocol):
    """What one step may prefill beside its decodes (cloud_engine.prefill_pacing sizes it in time)."""

    def grant(self, num_computed: int, wanted: int) -> int:
        """Prompt tokens a request with `num_computed` tokens done may compute now, of `wanted` (taken)."""
        ...


class TokenAllowance:
    """A fixed number of prompt tokens for the step, first come first served."""

    def __init__(self, num_tokens: int):
        self.num_tokens_left = num_tokens

    def grant(self, num_computed: int, wanted: int) -> int:
        num = max(0, min(wanted, self.num_tokens_left))
        self.num_tokens_left -= num
        return num


@dataclass
class SchedulerOutput:
    """What one step runs; the engine hands it to the runner and then back to `update_from_output`."""

    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # request id -> new tokens (batch order)
    preempted_ids: list[str] = field(default_factory=list)  # freed for recompute this step; drop their runner state
    new_request_ids: list[str] = field(default_factory=list)  # admitted (or readmitted) this step
    num_cached_tokens: dict[str, int] = field(
        default_factory=dict
    )  # admitted id -> its first tokens, from the prefix cache
    new_block_ids: dict[str, list[int]] = field(
        default_factory=dict
    )  # scheduled id -> blocks added (whole table if admitted)
    finished_ids: list[str] = field(default_factory=list)  # finished or aborted since the previous step
    # request id -> draft tokens scheduled after its last token (verified in this step's pass)
    scheduled_spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class ModelRunnerOutput:
    """What the runner sampled in one step."""

    # Per request that caught up: the accepted draft tokens then one token of the target's
    # own (a bare int is one token). Fewer than draft + 1 means the rest was rejected.
    sampled_token_ids: dict[str, int | list[int]] = field(default_factory=dict)


class Scheduler:
    """Owns the waiting queue and the running list; takes KV blocks from the cache manager."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        policy: str = "fcfs",
        max_draft_tokens: int = MAX_DRAFT_TOKENS,
    ):
        pool_tokens = kv_cache_manager.num_blocks * kv_cache_manager.block_size
        checks = [
            (max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {max_num_seqs}"),
            (max_num_batched_tokens >= 1, f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}"),
            (max_model_len >= 1, f"max_model_len must be >= 1, got {max_model_len}"),
            (
                long_prefill_token_threshold >= 0,
                f"long_prefill_token_threshold must be >= 0, got {long_prefill_token_threshold}",
            ),
            (policy in POLICIES, f"policy must be one of {', '.join(POLICIES)}, got {policy!r}"),
            (max_draft_tokens >= 0, f"max_draft_tokens must be >= 0, got {max_draft_tokens}"),
            (
                enable_chunked_prefill or max_num_batched_tokens >= max_model_len,
                f"without chunked prefill a whole prompt must fit one step: raise max_num_batched_tokens "
                f"({max_num_batched_tokens}) to max_model_len ({max_model_len}) or enable chunked prefill",
            ),
            (
                pool_tokens >= max_model_len,
                f"the KV cache holds {pool_tokens} tokens, less than max_model_len={max_model_len}: a long "
                "request could never run; add blocks or lower max_model_len",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.policy = policy
        self.max_draft_tokens = max_draft_tokens  # sizes a request's fair share of a step (_schedule_drafts)
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.waiting = WaitingQueue(policy)
        self.running: list[Request] = []
        self.num_preemptions_total = 0
        self._finished_ids: list[str] = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.num_unfinished > 0

    def add_request(self, request: Request) -> None:
        """Queue a new request; ValueError for a duplicate id or more than max_model_len tokens."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}; request ids must be unique")
        if not 1 <= request.num_tokens <= self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r} has {request.num_tokens} tokens; need 1..{self.max_model_len}"
            )
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Mark a request finished, take it out of the queues and free its blocks; None if unknown."""
        if not status.is_finished:
            raise ValueError(f"finish_request needs a finished status, got {status.name}")
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.kv_cache_manager.free(request)
        request.status = status
        self._finished_ids.append(request_id)
        return request

    def num_decoding(self) -> int:
        """Running requests with one token to compute: the decodes of the next step."""
        return sum(1 for r in self.running if r.num_tokens - r.num_computed_tokens <= 1)

    def schedule(self, prefill: PrefillAllowance | None = None) -> SchedulerOutput:
        """Pick this step's tokens per request, taking blocks for them (and preempting when short).
        `prefill`: how many prompt (or recompute) tokens the step may carry beside the decodes
        (cloud_engine.prefill_pacing sizes it from a step-time target); None: the token budget."""
        out = SchedulerOutput(finished_ids=self._finished_ids)
        self._finished_ids = []
        budget = self.max_num_batched_tokens
        prefill = TokenAllowance(budget) if prefill is None else prefill

        for request in list(self.running):
            if budget == 0:
                break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = self._num_new_tokens(request, request.num_computed_tokens, budget)
            # Without chunking a prompt runs whole or waits (_num_new_tokens): the budget cannot split it.
            prefilling = self.enable_chunked_prefill and request.num_tokens - request.num_computed_tokens > 1
            if prefilling:
                num_new = prefill.grant(request.num_computed_tokens, num_new)
            if num_new == 0:
                continue
            while (new_block_ids := self.kv_cache_manager.allocate_slots(request, num_new)) is None:
                victim = self._pick_victim()
                budget += out.num_scheduled_tokens.pop(victim.request_id, 0)
                out.new_block_ids.pop(victim.request_id, None)
                self._preempt(victim, out)
                if victim is request:
                    break
            if new_block_ids is None:
                continue
            out.num_scheduled_tokens[request.request_id] = num_new
            out.new_block_ids[request.request_id] = new_block_ids
            budget -= num_new
        budget -= self._schedule_drafts(out, budget)

        # Admitting right after a preemption would only take the blocks back and thrash the pool.
        while not out.preempted_ids and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting.peek()
            computed_block_ids, num_cached = self.kv_cache_manager.get_computed_blocks(request)
            num_new = self._num_new_tokens(request, num_cached, budget)
            if self.enable_chunked_prefill and num_new > 1:
                num_new = prefill.grant(num_cached, num_new)
            if num_new == 0:
                break  # head of line: later requests wait for it (FCFS fairness)
            new_block_ids = self.kv_cache_manager.allocate_slots(request, num_new, computed_block_ids)
            if new_block_ids is None:
                break
            self.waiting.pop()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            request.num_cached_tokens = min(num_cached, request.num_prompt_tokens)
            out.num_scheduled_tokens[request.request_id] = num_new
            out.new_block_ids[request.request_id] = list(computed_block_ids) + new_block_ids
            out.new_request_ids.append(request.request_id)
            out.num_cached_tokens[request.request_id] = num_cached
            budget -= num_new
        return out

    def update_from_output(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
        """Advance computed tokens, publish newly full blocks, and append each sampled token."""
        specs = scheduler_output.scheduled_spec_token_ids
        live = [
            (self.requests[rid], n, specs.get(rid, []))
            for rid, n in scheduler_output.num_scheduled_tokens.items()
            if rid in self.requests  # not finished or aborted while the step ran
        ]
        # Check everything before changing anything: a runner that samples the wrong requests is a bug.
        caught_up = {r.request_id for r, n, spec in live if r.num_computed_tokens + n == r.num_tokens + len(spec)}
        sampled = {
            rid: tokens if isinstance(tokens, list) else [tokens]
            for rid, tokens in runner_output.sampled_token_ids.items()
            if rid in self.requests
        }
        if set(sampled) != caught_up:
            raise ValueError(
                f"the runner must sample exactly the requests that caught up with their tokens: "
                f"expected {sorted(caught_up)}, got {sorted(sampled)}"
            )
        for request, num_new, spec in live:
            tokens = sampled.get(request.request_id, [])
            if tokens and not 1 <= len(tokens) <= len(spec) + 1:
                raise ValueError(f"request {request.request_id!r}: {len(tokens)} tokens from a draft of {len(spec)}")
            num_rejected = len(spec) + 1 - len(tokens) if tokens else 0
            request.num_computed_tokens += num_new - num_rejected
            for token_id in tokens:
                request.append_output_token(token_id)
            self.kv_cache_manager.cache_full_blocks(request)
            if num_rejected:  # give back the blocks that only the rejected tokens needed
                self.kv_cache_manager.free_excess_blocks(request, request.num_tokens)

    # -- internals -------------------------------------------------------------------------

    def _num_new_tokens(self, request: Request, num_computed: int, budget: int) -> int:
        """Tokens to give a request this step (0: none), from `num_computed` on."""
        # The KV of position max_model_len and beyond is never computed; the engine stops it there.
        num_new = min(request.num_tokens, self.max_model_len) - num_computed
        if num_new <= 0:
            return 0
        if not self.enable_chunked_prefill:
            return num_new if num_new <= budget else 0  # whole or not at all
        if self.long_prefill_token_threshold:
            num_new = min(num_new, self.long_prefill_token_threshold)
        return min(num_new, budget)

    def _schedule_drafts(self, out: SchedulerOutput, budget: int) -> int:
        """Add to each scheduled running request the part of its draft that fits (its draft is consumed
        either way), once every running request has its own tokens and their blocks: only after all its
        real tokens, within max_model_len, its fair share of the step, what is left of the budget and the
        free KV blocks (taking no one's: a draft never preempts). Returns the draft tokens scheduled."""
        fair_share = max(self.max_draft_tokens + 1, self.max_num_batched_tokens // max(1, len(self.running)))
        used = 0
        for request in self.running:
            num_new = out.num_scheduled_tokens.get(request.request_id)
            if num_new is None:
                continue  # not scheduled this step: its draft waits with it
            spec, request.spec_token_ids = request.spec_token_ids, []
            if not spec or request.num_computed_tokens + num_new != request.num_tokens:
                continue
            room = min(
                self.max_model_len - request.num_tokens,
                fair_share - num_new,
                budget - used,
                self.kv_cache_manager.num_free_slots(request) - num_new,
            )
            spec = spec[: max(0, room)]
            if not spec:
                continue
            new_block_ids = self.kv_cache_manager.allocate_slots(request, num_new + len(spec))  # free blocks only
            if new_block_ids is None:
                continue
            out.new_block_ids[request.request_id] += new_block_ids
            out.num_scheduled_tokens[request.request_id] = num_new + len(spec)
            out.scheduled_spec_token_ids[request.request_id] = spec
            used += len(spec)
        return used

    def _pick_victim(self) -> Request:
        """fcfs: the most recently arrived running request; priority: the least important, then most recent."""
        if self.policy == "fcfs":
            return max(reversed(self.running), key=lambda r: r.arrival_time)
        return max(reversed(self.running), key=lambda r: (r.priority, r.arrival_time))

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Free a running request's blocks; it goes back to the front of the queue for recompute."""
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.add_preempted(request)
        out.preempted_ids.append(request.request_id)
