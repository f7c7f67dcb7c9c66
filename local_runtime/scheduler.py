"""Token-budget scheduler for the local engine (vLLM v1's "computed tokens catch up" rule).

Every step each request is given some tokens under one budget: 1 for a decode,
up to the rest of the budget for a prefill chunk. Running requests go first;
waiting ones join while budget, sequence slots and KV blocks last. When a
running request cannot grow, the newest running request is preempted: its
blocks are freed, its slot's cells cleared, and it is recomputed later.

A finished request's slot and blocks go to the prompt cache (local_runtime.prompt_cache)
instead of back to the pool, so a later prompt with the same prefix copies its cells; cached
entries are evicted, least recently used first, whenever a slot or blocks are short, before
any waiting request is refused or running one preempted.

Slots are handed out lowest first. Where every slot owns its cells (llama.cpp's KV streams),
copying a prefix means copying the source's cells into another stream, so a newcomer whose best prefix is a cached
prompt takes that prompt's slot over instead (llama-server reuses an idle slot's cells the same
way), and running slots stay packed at the low ids, which llama.cpp needs to batch them in one
pass (LlamaBackend.decode).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from local_runtime.block_manager import BlockManager, PrefixHit
from local_runtime.prompt_cache import CachedKey, CachedPrompt, PromptCache
from local_runtime.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """What one step runs. Memory ops apply before the decode, clears first."""

    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens this step
    cleared_slots: list[int] = field(default_factory=list)  # slots whose cells to drop (seq_rm)
    prefix_copies: list[tuple[int, int, int]] = field(default_factory=list)  # (src slot, dst slot, n tokens)
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens and not self.cleared_slots


class Scheduler:
    """Owns the waiting queue, the running list, the slots and the block manager."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        cache_finished_prompts: bool = False,
        max_cached_prompts: int | None = None,
        slots_own_their_cells: bool = False,
    ):
        self.block_manager = block_manager
        self.cache_finished_prompts = cache_finished_prompts
        self.max_cached_prompts = max_num_seqs if max_cached_prompts is None else max_cached_prompts
        self.prompt_cache = PromptCache()
        self._pinned: set[CachedKey] = (
            set()
        )  # cache entries this schedule() copies from: not evictable until the copies ran
        self.max_num_batched_tokens = max_num_batched_tokens
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.slots_own_their_cells = slots_own_their_cells  # KV streams: take cached slots over, never copy from them
        self._free_slots: list[int] = list(range(max_num_seqs))  # a heap: the lowest free slot first
        self._slots_to_clear: list[int] = []
        self.num_preemptions_total = 0
        self.num_prefix_cache_hit_tokens_total = 0
        self.num_prefix_cache_query_tokens_total = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_schedulable(self) -> int:
        """Unfinished requests a step would run: all but the drafting requests held for their verdict."""
        return self.num_unfinished - sum(1 for request in self.running if request.is_held)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks only the prompt cache holds (free for the taking: evicting the entries frees them)."""
        return self.block_manager.num_blocks_held_only_by([entry.key for entry in self.prompt_cache])

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Mark a request finished; its slot and blocks go to the prompt cache (or back at once)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        if self.cache_finished_prompts and request.slot is not None and request.num_computed_tokens > 0:
            entry = self.prompt_cache.add(request.slot, request.all_token_ids, request.num_computed_tokens)
            self.block_manager.rename(request_id, entry.key)
            request.slot = None
            while len(self.prompt_cache) > self.max_cached_prompts and self._evict_one():
                pass
        else:
            self._release(request)
        request.status = status
        return request

    def clear_prompt_cache(self) -> list[int]:
        """Evict every cached prompt; the slots whose cells the caller must clear now (they are
        free slots from here on, so the next schedule must not clear them again)."""
        while self._evict_one():
            pass
        slots, self._slots_to_clear = self._slots_to_clear, []
        return slots

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        preempted_this_step = False

        for request in list(self.running):
            if request.status != RequestStatus.RUNNING or budget == 0 or request.is_held:
                continue  # preempted earlier in this loop, no budget left, or a draft waiting for its verdict
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while self.block_manager.allocate(request.request_id, request.num_computed_tokens + num_new) is None:
                if self._evict_one():
                    continue
                # The newest request sits at or after this one, so it has no budget yet to return.
                victim = self.running[-1]
                self._preempt(victim, out)
                preempted_this_step = True
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                continue
            out.num_scheduled_tokens[request.request_id] = num_new
            budget -= num_new

        # Joining right after a preemption would just thrash the pool.
        while self.waiting and budget > 0 and (self._free_slots or self.prompt_cache) and not preempted_this_step:
            request = self.waiting[0]
            num_new = self._admit(request, budget, out)
            if num_new is None:
                break
            self.waiting.popleft()
            out.num_scheduled_tokens[request.request_id] = num_new
            budget -= num_new

        self._pinned = set()  # the copies run before anything can evict again
        out.cleared_slots, self._slots_to_clear = self._slots_to_clear, []
        return out

    def on_step_done(self, out: SchedulerOutput) -> None:
        """Advance computed tokens and publish newly full blocks for prefix sharing."""
        for request_id, num_new in out.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran, or sent back to be recomputed
            request.num_computed_tokens += num_new
            self.block_manager.publish_full_blocks(request_id, request.all_token_ids, request.num_computed_tokens)

    def rewind(self, request_id: str, keep: int, append: list[int], hold_at: int | None) -> tuple[int | None, int]:
        """A drafting request's output cut to its first `keep` tokens, then `append` (what the verifier
        emitted instead); its books keep the cells of the positions still valid. Returns (its slot, the
        positions it keeps) for the engine to drop the rest of the slot's cells; (None, 0) while it waits."""
        request = self.requests[request_id]
        request.truncate_output(keep)
        for token_id in append:
            request.append_output_token(token_id)
        request.hold_at = hold_at
        if request.status != RequestStatus.RUNNING:
            return None, 0  # waiting (not admitted, or preempted): recomputed from its tokens when admitted
        # The last token is never computed before it is scheduled: the step that computes it samples the next.
        kept = min(request.num_computed_tokens, request.num_prompt_tokens + keep, request.num_tokens - 1)
        kept = self.block_manager.rewind(request_id, kept)
        request.num_computed_tokens = kept
        return request.slot, kept

    def preempt(self, request_id: str) -> None:
        """Send a running request back to the front of the queue to be recomputed from scratch (the
        engine lost its cells in a failed step): its blocks are freed and its slot cleared."""
        self._preempt(self.requests[request_id], SchedulerOutput())

    # -- internals -------------------------------------------------------------------------

    def _admit(self, request: Request, budget: int, out: SchedulerOutput) -> int | None:
        """Take a slot and blocks for the first chunk; None (and no change) if they are short."""
        # Leave at least the last token to compute: its logits pick the next token.
        hit = self.block_manager.find_prefix(request.all_token_ids, max_tokens=request.num_tokens - 1)
        source, num_cached = self._longest_computed_prefix(request, hit)
        num_new = min(request.num_tokens - num_cached, budget)
        if self.slots_own_their_cells and isinstance(source, CachedPrompt) and source.key not in self._pinned:
            return self._take_over(request, source, hit, num_cached, num_new, out)
        if not self._make_room(self._blocks_needed(num_cached + num_new, hit), self._keep_for(source)):
            # Room only by evicting the prefix's own cache entry: compute the prompt from scratch.
            if not isinstance(source, CachedPrompt):
                return None
            hit, source, num_cached = None, None, 0
            num_new = min(request.num_tokens, budget)
            if not self._make_room(self._blocks_needed(num_new, None), self._pinned):
                return None
        slot = heapq.heappop(self._free_slots)
        if hit:
            self.block_manager.share(request.request_id, hit)
        if num_cached:
            out.prefix_copies.append((source.slot, slot, num_cached))
            if isinstance(source, CachedPrompt):
                self.prompt_cache.touch(source)
                self._pinned.add(source.key)
        return self._start(request, slot, num_cached, num_new)

    def _take_over(
        self,
        request: Request,
        entry: CachedPrompt,
        hit: PrefixHit | None,
        num_cached: int,
        num_new: int,
        out: SchedulerOutput,
    ) -> int | None:
        """Admit `request` into the slot of the cached prompt holding its prefix: the entry ends, its
        first `num_cached` cells become the request's and the rest are dropped (no copy)."""
        self.prompt_cache.remove(entry.key)
        if hit:
            self.block_manager.share(request.request_id, hit)
        self.block_manager.free(entry.key)
        if not self._make_room(self._blocks_needed(num_cached + num_new, hit), self._pinned, need_slot=False):
            # The pool is short even so: the entry is gone (as eviction would have done) and its slot freed.
            self.block_manager.free(request.request_id)
            self._slots_to_clear.append(entry.slot)
            heapq.heappush(self._free_slots, entry.slot)
            return None
        out.prefix_copies.append((entry.slot, entry.slot, num_cached))
        return self._start(request, entry.slot, num_cached, num_new)

    def _start(self, request: Request, slot: int, num_cached: int, num_new: int) -> int:
        """The common end of an admission: the rest of the blocks, the slot, and the books."""
        self.num_prefix_cache_query_tokens_total += request.num_tokens
        self.num_prefix_cache_hit_tokens_total += num_cached
        self.block_manager.allocate(request.request_id, num_cached + num_new)
        request.slot = slot
        request.num_computed_tokens = num_cached
        if request.status == RequestStatus.WAITING:
            request.num_cached_tokens = num_cached
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return num_new

    def _blocks_needed(self, num_tokens: int, hit: PrefixHit | None) -> int:
        return -(-num_tokens // self.block_manager.block_size) - (len(hit.block_ids) if hit else 0)

    def _keep_for(self, source: Request | CachedPrompt | None) -> set[CachedKey]:
        return self._pinned | {source.key} if isinstance(source, CachedPrompt) else self._pinned

    def _make_room(self, num_blocks: int, keep: set[CachedKey], need_slot: bool = True) -> bool:
        """Evict cached prompts not in `keep` until a slot (if `need_slot`) and `num_blocks` blocks are free."""
        while (need_slot and not self._free_slots) or self.block_manager.num_free_blocks < num_blocks:
            if not self._evict_one(keep):
                return False
        return True

    def _evict_one(self, keep: set[CachedKey] | None = None) -> bool:
        """Drop the least recently used cached prompt (its slot is cleared by the next step)."""
        entry = self.prompt_cache.pop_least_recent(self._pinned if keep is None else keep)
        if entry is None:
            return False
        self.block_manager.free(entry.key)
        self._slots_to_clear.append(entry.slot)
        heapq.heappush(self._free_slots, entry.slot)
        return True

    def _longest_computed_prefix(
        self, request: Request, hit: PrefixHit | None
    ) -> tuple[Request | CachedPrompt | None, int]:
        """The sequence (running, or a cached prompt) whose computed cells hold the longest prefix of
        `request`, and its length.

        Full blocks come from the hash map (shared in the books); past them, llama.cpp's cells
        can be shared token by token, as llama-server's prompt cache reuses a slot's common
        prefix: a system prompt of 24 tokens shares 24, not the 16 of its one full block. The
        partial block is still booked as the newcomer's own, so the books stay an upper bound."""
        limit = request.num_tokens - 1
        tokens = request.all_token_ids
        base = hit.num_tokens if hit else 0
        candidates = (
            [self.requests.get(hit.source) or self.prompt_cache.get(hit.source)]
            if hit
            else [*self.running, *self.prompt_cache]
        )
        best, best_len = (candidates[0] if hit else None), base
        for candidate in candidates:
            n = _common_prefix(candidate.all_token_ids, tokens, base, min(candidate.num_computed_tokens, limit))
            if n > best_len:
                best, best_len = candidate, n
        if self.slots_own_their_cells and not isinstance(best, CachedPrompt):
            # A cached prompt as long is taken over in place; a running one would be a stream copy.
            for entry in self.prompt_cache:
                n = _common_prefix(entry.all_token_ids, tokens, 0, min(entry.num_computed_tokens, limit))
                if n >= best_len and n > 0 and entry.key not in self._pinned:
                    best, best_len = entry, n
                    break
        return best, best_len

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Free a running request for recompute; it rejoins the front of the queue."""
        self.running.remove(request)
        self._release(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting.appendleft(request)
        out.preempted_ids.append(request.request_id)
        self.num_preemptions_total += 1

    def _release(self, request: Request) -> None:
        self.block_manager.free(request.request_id)
        if request.slot is not None:
            self._slots_to_clear.append(request.slot)
            heapq.heappush(self._free_slots, request.slot)
            request.slot = None


def _common_prefix(theirs: list[int], tokens: list[int], start: int, end: int) -> int:
    """How far past `start` (known to match) `theirs` and `tokens` agree, up to `end`."""
    n = start
    while n < end and theirs[n] == tokens[n]:
        n += 1
    return n
