"""Block accounting over llama.cpp's unified KV pool, with full-block prefix sharing.

llama.cpp owns the cells; tandem owns the decision of who may use how many. The
pool of `num_blocks * block_size` cells is split into fixed-size logical blocks.
A sequence holds the blocks that cover its computed and scheduled tokens; a
block is in use while any sequence references it. A full, computed block is
published under a hash chained over its parent's hash and its tokens, so a new
sequence with the same prefix references the same blocks (its cells are shared
with `llama_memory_seq_cp`) instead of recomputing them.

Invariant: the cells llama.cpp holds are never more than the cells of blocks in
use, so admission by free blocks means `llama_decode` always finds room.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence

SeqKey = Hashable


@dataclass
class KVBlock:
    """One fixed-size group of KV cells, counted by the sequences that use it."""

    block_id: int
    holders: set = field(default_factory=set)  # sequences referencing the block (ref count = len)
    block_hash: int | None = None  # set once the block is full and computed
    token_ids: tuple[int, ...] = ()  # the block's tokens, to verify a hash match exactly

    @property
    def ref_count(self) -> int:
        return len(self.holders)


@dataclass
class PrefixHit:
    """A cached prefix a new sequence can share instead of computing."""

    source: SeqKey  # a live sequence whose cells hold the prefix (the seq_cp source)
    block_ids: list[int]  # the source's blocks covering the prefix, in order
    num_tokens: int  # len(block_ids) * block_size


def hash_block(parent_hash: int, block_token_ids: Sequence[int]) -> int:
    """A full block's key: its tokens, chained over the key of the block before it (0 for the first)."""
    return hash((parent_hash, tuple(block_token_ids)))


def chain_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Hashes of the full blocks of `token_ids`, each chained over its parent's."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


class BlockManager:
    """Reference-counted blocks, a free queue, and a hash map of shareable full blocks."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free_ids: deque[int] = deque(range(num_blocks))
        self._tables: dict[SeqKey, list[int]] = {}
        # block hash -> ids of the live blocks with that prefix, oldest first: two sequences
        # admitted in one step compute the same prefix into twin blocks, and when the first is
        # freed the twin must stay findable.
        self._hashed: dict[int, dict[int, None]] = {}
        self._num_published: dict[SeqKey, int] = {}  # leading blocks of a table already hashed

    # -- queries ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free_ids)

    def block_table(self, seq: SeqKey) -> list[int]:
        return list(self._tables.get(seq, ()))

    def num_blocks_needed(self, seq: SeqKey, num_tokens: int) -> int:
        """New blocks `seq` must take so that `num_tokens` tokens fit."""
        have = len(self._tables.get(seq, ()))
        return max(0, -(-num_tokens // self.block_size) - have)

    def can_allocate(self, seq: SeqKey, num_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def find_prefix(self, token_ids: Sequence[int], max_tokens: int) -> PrefixHit | None:
        """The longest run of live full blocks matching `token_ids`, at most `max_tokens` long."""
        last_block: KVBlock | None = None
        num_matched = 0
        for i, block_hash in enumerate(chain_block_hashes(token_ids, self.block_size)):
            if (i + 1) * self.block_size > max_tokens:
                break
            twins = self._hashed.get(block_hash)
            if not twins:
                break
            block = self.blocks[next(iter(twins))]
            start = i * self.block_size
            if block.token_ids != tuple(token_ids[start : start + self.block_size]):
                break  # a hash collision: never share cells that hold other tokens
            last_block, num_matched = block, i + 1
        if last_block is None:
            return None
        # Any holder of the last block computed the whole chain before it; share exactly
        # its blocks so the accounted blocks are the blocks whose cells get shared.
        source = next(iter(last_block.holders))
        # The cells shared are the source's, but the blocks checked above are whichever
        # blocks the hash map points at, possibly other sequences' for earlier positions.
        # Verify the source's own blocks too: under a chain-hash collision its earlier
        # blocks could hold other tokens, and sharing them would hand over wrong KV.
        block_ids: list[int] = []
        for i, block_id in enumerate(self._tables[source][:num_matched]):
            start = i * self.block_size
            if self.blocks[block_id].token_ids != tuple(token_ids[start : start + self.block_size]):
                break
            block_ids.append(block_id)
        if not block_ids:
            return None
        return PrefixHit(source, block_ids, len(block_ids) * self.block_size)

    # -- changes ---------------------------------------------------------------------------

    def share(self, seq: SeqKey, hit: PrefixHit) -> None:
        """Start `seq`'s table with the blocks of a prefix hit."""
        if self._tables.get(seq):
            raise ValueError(f"sequence {seq!r} already holds blocks; share a prefix only at admission")
        for block_id in hit.block_ids:
            self.blocks[block_id].holders.add(seq)
        self._tables[seq] = list(hit.block_ids)
        self._num_published[seq] = len(hit.block_ids)  # published by the sequence that computed them

    def allocate(self, seq: SeqKey, num_tokens: int) -> list[int] | None:
        """Grow `seq`'s table to fit `num_tokens` tokens; the new block ids, or None if the pool is short."""
        needed = self.num_blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            return None
        table = self._tables.setdefault(seq, [])
        new_ids = [self._free_ids.popleft() for _ in range(needed)]
        for block_id in new_ids:
            block = self.blocks[block_id]
            block.holders.add(seq)
            table.append(block_id)
        return new_ids

    def publish_full_blocks(self, seq: SeqKey, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Make `seq`'s full, computed blocks findable by later sequences with the same prefix.

        Incremental (nano-vllm's hash_blocks): only blocks filled since the last call are
        hashed, each seeded from its parent's hash, so a step costs the new blocks, not the chain."""
        table = self._tables.get(seq, [])
        num_full = min(num_computed_tokens // self.block_size, len(table))
        start = self._num_published.get(seq, 0)
        for i in range(start, num_full):
            block = self.blocks[table[i]]
            if block.block_hash is None:
                parent = self.blocks[table[i - 1]].block_hash if i else 0
                block.token_ids = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
                block.block_hash = hash_block(parent, block.token_ids)
            self._hashed.setdefault(block.block_hash, {})[block.block_id] = None
        if num_full > start:
            self._num_published[seq] = num_full

    def rewind(self, seq: SeqKey, num_tokens: int) -> int:
        """`seq` keeps the cells of its first `num_tokens` positions only (a drafting request rewound to
        what was accepted): the blocks past them are no longer findable by hash, and a block another
        sequence shares is let go rather than overwritten; when the block holding position `num_tokens`
        is such a block, `seq` keeps less (down to that block's start, recomputed later). Returns the
        positions kept."""
        table = self._tables.get(seq, [])
        size = self.block_size
        first = num_tokens // size  # the first block not wholly kept
        shared = next((i for i in range(first, len(table)) if len(self.blocks[table[i]].holders) > 1), None)
        if shared is not None:
            if shared == first:
                num_tokens = first * size
            for block_id in table[shared:]:
                self.blocks[block_id].holders.discard(seq)  # others hold it: it stays theirs, unchanged
            del table[shared:]
        for block_id in table[first:]:
            block = self.blocks[block_id]
            if block.block_hash is not None:
                twins = self._hashed.get(block.block_hash)
                if twins is not None:
                    twins.pop(block_id, None)
                    if not twins:
                        del self._hashed[block.block_hash]
                block.block_hash, block.token_ids = None, ()
        if seq in self._num_published:
            self._num_published[seq] = min(self._num_published[seq], num_tokens // size)
        return num_tokens

    def rename(self, seq: SeqKey, new_key: SeqKey) -> None:
        """Hand `seq`'s blocks to `new_key` unchanged (a finished sequence's blocks kept by the prompt cache)."""
        if new_key in self._tables:
            raise ValueError(f"{new_key!r} already holds blocks")
        table = self._tables.pop(seq, [])
        for block_id in table:
            holders = self.blocks[block_id].holders
            holders.discard(seq)
            holders.add(new_key)
        self._tables[new_key] = table
        if seq in self._num_published:
            self._num_published[new_key] = self._num_published.pop(seq)

    def num_blocks_held_only_by(self, keys: Sequence[SeqKey]) -> int:
        """Blocks that no sequence but those of `keys` references (what evicting them all would free)."""
        key_set = set(keys)
        seen = {b for key in key_set for b in self._tables.get(key, ())}
        return sum(1 for b in seen if self.blocks[b].holders <= key_set)

    def free(self, seq: SeqKey) -> None:
        """Drop `seq`'s references; blocks nobody holds return to the free queue."""
        self._num_published.pop(seq, None)
        for block_id in self._tables.pop(seq, []):
            block = self.blocks[block_id]
            block.holders.discard(seq)
            if block.holders:
                continue
            twins = self._hashed.get(block.block_hash)  # None for an unpublished block
            if twins is not None:
                twins.pop(block_id, None)
                if not twins:
                    del self._hashed[block.block_hash]
            block.block_hash, block.token_ids = None, ()
            self._free_ids.append(block_id)

    def check_invariants(self) -> None:
        """Raise AssertionError if the books do not balance (used by tests and debug builds)."""
        held = {b for table in self._tables.values() for b in table}
        free = set(self._free_ids)
        assert len(free) == len(self._free_ids), "a block is in the free queue twice"
        assert not (held & free), f"blocks both held and free: {sorted(held & free)}"
        assert held | free == set(range(self.num_blocks)), "a block is neither held nor free"
        for block in self.blocks:
            expected = {s for s, t in self._tables.items() if block.block_id in t}
            assert block.holders == expected, f"block {block.block_id} holders {block.holders} != {expected}"
        for block_hash, twins in self._hashed.items():
            assert twins, f"hash {block_hash} maps to no block"
            for block_id in twins:
                assert self.blocks[block_id].holders, f"hash {block_hash} points at free block {block_id}"
                assert self.blocks[block_id].block_hash == block_hash, f"block {block_id} is mapped under another hash"
        for seq, num in self._num_published.items():
            assert num <= len(self._tables.get(seq, ())), f"{seq!r} published more blocks than it holds"
