"""The cloud engine's pool of paged-KV blocks: reference counts, an LRU free queue, a prefix cache.

Every block of the GPU KV cache is one `KVBlock`. A block is in use while its
reference count is positive (one reference per request table holding it). A
full, computed block can be published under a `BlockHash` naming its whole
prefix; a later request with the same prefix then takes the same block instead
of recomputing it.

Freed blocks are not wiped: a block that still holds a published hash stays
findable while it sits in the free queue, and only loses its hash when the
allocator takes it for new tokens (eviction). The queue is therefore an LRU
list: allocation takes from the head; freed cached blocks go to the tail, and
freed blocks without a hash go to the head, since nobody can ever reuse their
contents and evicting them first keeps cached prefixes alive longer.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence


class BlockHash:
    """Prefix-cache key of one full block: the prefix's digest plus the block's own token ids.

    `digest` is SHA-256 chained over the parent block's digest and this block's
    tokens, so it names the whole prefix up to the end of the block. Python's
    `hash()` is not collision resistant (one tenant could craft a prompt whose
    64-bit hash matches another's and read its KV); SHA-256 is. Equality also
    compares the block's token ids, so the cache never returns a block whose own
    tokens differ, whatever the digest says.
    """

    __slots__ = ("digest", "token_ids", "_hash")

    def __init__(self, digest: bytes, token_ids: tuple[int, ...]):
        self.digest = digest  # SHA-256 over the parent's digest and token_ids
        self.token_ids = token_ids  # the block's tokens, checked on every cache lookup
        self._hash = int.from_bytes(digest[:8], "little")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockHash):
            return NotImplemented
        return self.digest == other.digest and self.token_ids == other.token_ids

    def __repr__(self) -> str:
        return f"BlockHash({self.digest[:6].hex()}…, {len(self.token_ids)} tokens)"


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The key of a full block whose preceding block has key `parent` (None for the first block)."""
    tokens = tuple(token_ids)
    hasher = hashlib.sha256(parent.digest if parent is not None else b"")
    hasher.update(array("q", tokens).tobytes())  # fixed-width, so no two token lists share bytes
    return BlockHash(hasher.digest(), tokens)


@dataclass
class KVBlock:
    """One fixed-size block of the KV cache."""

    block_id: int
    ref_count: int = 0  # request tables holding the block; 0 means it sits in the free queue
    block_hash: BlockHash | None = None  # set while the block is published in the prefix cache


class BlockPool:
    """Blocks, their free queue (LRU order) and the hash -> block map of published full blocks."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}; give the KV cache more memory")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Ordered free set: O(1) take from the head, append at the tail, and removal from the
        # middle when a prefix hit revives a free cached block.
        self._free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, int] = {}
        self.num_evictions_total = 0  # cached blocks whose hash was dropped to reuse them

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_ids)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks published in the prefix cache, in use or free."""
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """The free queue from head (next to be allocated) to tail."""
        return list(self._free_ids)

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        """The id of the block published under `block_hash`, or None."""
        return self._cached.get(block_hash)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` blocks from the head of the free queue, or None (and no change) if short."""
        if num_blocks > len(self._free_ids):
            return None
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free_ids.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
                self.num_evictions_total += 1
            block.ref_count = 1
            block_ids.append(block_id)
        return block_ids

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference on each block (prefix hits); free ones leave the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free_ids[block_id]
            block.ref_count += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference on each block, in eviction order: the first one freed is evicted first."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} freed more often than it was taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free_ids[block_id] = None
                if block.block_hash is None:
                    self._free_ids.move_to_end(block_id, last=False)

    def cache_block(self, block_id: int, block_hash: BlockHash) -> bool:
        """Publish a full, computed block; False when another block already holds that prefix."""
        if not self.enable_caching:
            return False
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if block.block_hash != block_hash:
                raise RuntimeError(f"block {block_id} is already published under another hash")
            return True
        if block.ref_count == 0:
            raise RuntimeError(f"block {block_id} is free; publish blocks only while a request holds them")
        # Two requests that computed the same prefix side by side hold twins; keep the first.
        if block_hash in self._cached:
            return False
        self._cached[block_hash] = block_id
        block.block_hash = block_hash
        return True

    def reset_prefix_cache(self) -> int:
        """Unpublish every free cached block (a cold cache for benchmarks); how many were dropped."""
        num_dropped = 0
        for block_id in list(self._free_ids):
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
                self._free_ids.move_to_end(block_id, last=False)
                num_dropped += 1
        return num_dropped

    def check_invariants(self, tables: Iterable[Sequence[int]]) -> None:
        """Raise AssertionError unless the pool agrees with the request tables that hold its blocks."""
        expected = [0] * self.num_blocks
        for table in tables:
            assert len(set(table)) == len(table), f"a request table holds a block twice: {list(table)}"
            for block_id in table:
                expected[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == expected[block.block_id], (
                f"block {block.block_id} ref_count {block.ref_count} != {expected[block.block_id]} tables holding it"
            )
        assert set(self._free_ids) == {b.block_id for b in self.blocks if b.ref_count == 0}, (
            "the free queue is not exactly the blocks nobody holds"
        )
        for block_hash, block_id in self._cached.items():
            assert self.blocks[block_id].block_hash is block_hash, f"hash {block_hash} maps to block {block_id}"
        published = [b for b in self.blocks if b.block_hash is not None]
        assert len(published) == len(self._cached), "a block holds a hash the cache map does not know"
        assert self.enable_caching or not self._cached, "prefix caching is off but blocks are published"
