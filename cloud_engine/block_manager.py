"""Per-request KV block tables over the block pool, with full-block prefix caching.

A request's table lists the blocks that hold its tokens, in order; it grows as
the scheduler gives the request tokens. At admission the request first looks up
the longest run of cached full blocks matching its tokens and takes those blocks
instead of computing them. After a step computed tokens, the request's newly
full blocks are published, so later requests (and its own recompute after a
preemption) can reuse them.
"""

from __future__ import annotations

from typing import Sequence

from cloud_engine.block_pool import BlockHash, BlockPool, hash_block
from cloud_engine.request import Request

__all__ = ["BlockHash", "KVCacheManager", "hash_block"]


class KVCacheManager:
    """Block tables of the running requests over one `BlockPool`."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self._tables: dict[str, list[int]] = {}
        self._num_published: dict[str, int] = {}  # leading blocks of each table already offered to the cache
        self.num_prefix_cache_queries_total = 0  # tokens of requests looked up at admission
        self.num_prefix_cache_hits_total = 0  # of those, tokens served from cached blocks

    # -- queries ---------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds (free cached blocks do not count)."""
        return self.pool.num_blocks - self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Share of the pool in use, in [0, 1]."""
        return self.num_used_blocks / self.pool.num_blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a copy; empty if it holds none)."""
        return list(self._tables.get(request_id, ()))

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.pool.num_free_blocks

    def num_free_slots(self, request: Request) -> int:
        """Tokens past its computed ones a running request can be given without taking anyone's blocks:
        the rest of its own blocks and the free ones."""
        held = len(self._tables.get(request.request_id, ()))
        return (held + self.pool.num_free_blocks) * self.block_size - request.num_computed_tokens

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The longest cached full-block prefix of the request's tokens: (block ids, tokens they hold).

        At least the last token is always left to compute: its logits pick the next token.
        Nothing changes here; pass the blocks to `allocate_slots` to take them.
        """
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._block_hashes(request, max_blocks)
        block_ids: list[int] = []
        for block_hash in hashes[:max_blocks]:
            block_id = self.pool.get_cached_block(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids, len(block_ids) * self.block_size

    # -- changes ---------------------------------------------------------------------------

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_block_ids: Sequence[int] = ()
    ) -> list[int] | None:
        """Grow the request's table to hold its computed tokens, the computed blocks and `num_new_tokens`.

        `computed_block_ids` (from `get_computed_blocks`) are passed once, at admission,
        while the request holds no blocks and its `num_computed_tokens` is still 0.
        Returns the newly allocated block ids (not the computed ones), or None and
        changes nothing when the pool is short.
        """
        table = self._tables.get(request.request_id)
        if computed_block_ids and (table is not None or request.num_computed_tokens):
            raise ValueError(
                f"request {request.request_id!r}: pass computed blocks only at admission, before "
                "it holds blocks or counts computed tokens"
            )
        num_held = len(table) if table is not None else len(computed_block_ids)
        num_tokens = request.num_computed_tokens + len(computed_block_ids) * self.block_size + num_new_tokens
        num_new_blocks = max(0, self.num_blocks_for(num_tokens) - num_held)
        # Computed blocks nobody holds sit in the free queue: taking them uses free blocks too.
        num_revived = sum(1 for b in computed_block_ids if self.pool.blocks[b].ref_count == 0)
        if num_new_blocks + num_revived > self.pool.num_free_blocks:
            return None
        if table is None:
            table = self._tables[request.request_id] = []
            self._num_published[request.request_id] = len(computed_block_ids)
            if self.enable_prefix_caching:
                self.num_prefix_cache_queries_total += request.num_tokens
                self.num_prefix_cache_hits_total += len(computed_block_ids) * self.block_size
            self.pool.touch(computed_block_ids)
            table.extend(computed_block_ids)
        new_block_ids = self.pool.allocate(num_new_blocks)
        assert new_block_ids is not None  # checked above
        table.extend(new_block_ids)
        return new_block_ids

    def cache_full_blocks(self, request: Request) -> None:
        """Publish the request's blocks that became full of computed tokens since the last call."""
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request.request_id)
        if not table:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(table))
        start = self._num_published[request.request_id]
        if num_full <= start:
            return
        hashes = self._block_hashes(request, num_full)
        for i in range(start, num_full):
            self.pool.cache_block(table[i], hashes[i])
        self._num_published[request.request_id] = num_full

    def free_excess_blocks(self, request: Request, num_tokens: int) -> int:
        """Free the tail blocks the request needs no more to hold `num_tokens` tokens (the blocks
        rejected draft tokens took); how many were freed. Never drops a published block."""
        table = self._tables.get(request.request_id)
        if not table:
            return 0
        keep = max(self.num_blocks_for(num_tokens), self._num_published[request.request_id])
        excess = table[keep:]
        if excess:
            del table[keep:]
            self.pool.free(reversed(excess))
        return len(excess)

    def free(self, request: Request | str) -> None:
        """Drop the request's references; blocks nobody else holds go back to the free queue."""
        request_id = request if isinstance(request, str) else request.request_id
        table = self._tables.pop(request_id, None)
        self._num_published.pop(request_id, None)
        if table:
            # The tail of a request is the least likely to be shared: evict it first.
            self.pool.free(reversed(table))

    def reset_prefix_cache(self) -> int:
        """Forget every cached block no request holds; how many were dropped."""
        return self.pool.reset_prefix_cache()

    def check_invariants(self) -> None:
        """Raise AssertionError if the books do not balance (for tests and debug builds)."""
        self.pool.check_invariants(self._tables.values())
        assert set(self._num_published) == set(self._tables), "publish progress kept for unknown requests"
        for request_id, table in self._tables.items():
            assert self._num_published[request_id] <= len(table), f"{request_id} published past its table"

    # -- internals -------------------------------------------------------------------------

    def _block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """The request's chained block hashes, extended to cover its first `num_blocks` full blocks."""
        hashes = request.block_hashes
        tokens, bs = request.all_token_ids, self.block_size
        num_blocks = min(num_blocks, len(tokens) // bs)
        while len(hashes) < num_blocks:
            start = len(hashes) * bs
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[start : start + bs]))
        return hashes
