"""The local engine's block manager: allocation, reference counts, prefix sharing.

Unit tests pin each contract; a hypothesis state machine drives random sequences
of allocate / append / compute+publish / share-a-prefix / free / preempt over
several sequences and checks the books after every rule.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from local_runtime import block_manager as bm_module
from local_runtime.block_manager import BlockManager, PrefixHit, chain_block_hashes

BS = 4


def make_bm(num_blocks: int = 8, block_size: int = BS) -> BlockManager:
    return BlockManager(num_blocks, block_size)


def computed(bm: BlockManager, seq, tokens: list[int]) -> None:
    """Allocate for all of `tokens`, then mark them computed and publish (what a finished prefill does)."""
    assert bm.allocate(seq, len(tokens)) is not None
    bm.publish_full_blocks(seq, tokens, len(tokens))


# -- construction --------------------------------------------------------------------------


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 4)])
def test_rejects_empty_pool_or_blocks(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockManager(num_blocks, block_size)


def test_fresh_pool_is_all_free():
    bm = make_bm(5)
    assert bm.num_free_blocks == 5 and bm.num_used_blocks == 0
    assert bm.block_table("nobody") == []
    bm.check_invariants()


# -- allocation ----------------------------------------------------------------------------


def test_allocate_on_demand_as_sequence_grows():
    bm = make_bm(8)
    first = bm.allocate("a", 1)
    assert first is not None and len(first) == 1
    # Tokens 2..4 still fit the first block: nothing new.
    for n in (2, 3, 4):
        assert bm.allocate("a", n) == []
    second = bm.allocate("a", 5)
    assert second is not None and len(second) == 1
    assert bm.block_table("a") == first + second
    # Growing by several blocks at once takes exactly the blocks needed.
    more = bm.allocate("a", 17)
    assert more is not None and len(more) == 3
    assert len(bm.block_table("a")) == 5
    assert bm.num_free_blocks == 3
    # Asking for fewer tokens than held never shrinks or grows the table.
    assert bm.allocate("a", 2) == []
    assert len(bm.block_table("a")) == 5
    bm.check_invariants()


def test_num_blocks_needed_and_can_allocate():
    bm = make_bm(3)
    assert bm.num_blocks_needed("a", 0) == 0
    assert bm.num_blocks_needed("a", 1) == 1
    assert bm.num_blocks_needed("a", 4) == 1
    assert bm.num_blocks_needed("a", 5) == 2
    assert bm.can_allocate("a", 12) and not bm.can_allocate("a", 13)
    bm.allocate("a", 6)
    assert bm.num_blocks_needed("a", 6) == 0
    assert bm.num_blocks_needed("a", 9) == 1
    assert bm.can_allocate("a", 12) and not bm.can_allocate("a", 13)
    assert bm.can_allocate("b", 4) and not bm.can_allocate("b", 5)


def test_allocate_returns_none_and_takes_nothing_when_pool_is_short():
    bm = make_bm(4)
    assert bm.allocate("a", 12) is not None  # 3 of 4 blocks
    before_free = bm.num_free_blocks
    # A new sequence that needs 2 blocks gets nothing, not the 1 that is left.
    assert bm.allocate("b", 8) is None
    assert bm.num_free_blocks == before_free == 1
    assert bm.block_table("b") == []
    # A growing sequence that needs 2 more gets nothing either.
    assert bm.allocate("a", 20) is None
    assert len(bm.block_table("a")) == 3
    assert bm.num_free_blocks == 1
    bm.check_invariants()
    # What does fit still works.
    assert bm.allocate("b", 4) is not None
    assert bm.num_free_blocks == 0
    assert bm.allocate("a", 13) is None
    bm.check_invariants()


def test_free_returns_blocks_and_is_idempotent():
    bm = make_bm(6)
    a = bm.allocate("a", 10)
    b = bm.allocate("b", 5)
    assert bm.num_free_blocks == 1
    bm.free("a")
    assert bm.num_free_blocks == 4
    assert bm.block_table("a") == []
    assert all(bm.blocks[i].ref_count == 0 for i in a)
    assert all(bm.blocks[i].holders == {"b"} for i in b)
    bm.free("a")  # freeing twice, or a sequence never seen, is a no-op
    bm.free("never-seen")
    assert bm.num_free_blocks == 4
    bm.free("b")
    assert bm.num_free_blocks == 6
    bm.check_invariants()
    # The freed blocks are reusable.
    assert bm.allocate("c", 24) is not None
    assert bm.num_free_blocks == 0
    bm.check_invariants()


# -- sharing -------------------------------------------------------------------------------


def test_share_counts_references_and_block_survives_until_last_holder_frees():
    bm = make_bm(8)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    computed(bm, "a", prompt)
    a_table = bm.block_table("a")
    hit = bm.find_prefix(prompt + [10], max_tokens=len(prompt))
    assert hit is not None and hit.num_tokens == 8 and hit.source == "a"
    assert hit.block_ids == a_table[:2]

    bm.share("b", hit)
    assert bm.block_table("b") == a_table[:2]
    for block_id in a_table[:2]:
        assert bm.blocks[block_id].ref_count == 2
        assert bm.blocks[block_id].holders == {"a", "b"}
    assert bm.blocks[a_table[2]].ref_count == 1
    # Sharing takes no blocks from the pool; b's own tail does.
    assert bm.num_free_blocks == 5
    assert bm.allocate("b", 10) is not None
    assert bm.num_free_blocks == 4
    bm.check_invariants()

    # A third sharer.
    bm.share("c", bm.find_prefix(prompt + [11], max_tokens=9))
    assert all(bm.blocks[i].ref_count == 3 for i in a_table[:2])

    bm.free("a")
    # a's private last block returns; the shared ones stay, and stay findable.
    assert bm.num_free_blocks == 5
    for block_id in a_table[:2]:
        assert bm.blocks[block_id].holders == {"b", "c"}
    hit2 = bm.find_prefix(prompt, max_tokens=8)
    assert hit2 is not None and hit2.block_ids == a_table[:2] and hit2.source in {"b", "c"}
    bm.check_invariants()

    bm.free("b")
    assert all(bm.blocks[i].holders == {"c"} for i in a_table[:2])
    assert bm.num_free_blocks == 6
    bm.free("c")
    assert bm.num_free_blocks == 8
    assert bm._hashed == {}
    assert bm.find_prefix(prompt, max_tokens=8) is None
    bm.check_invariants()


def test_share_only_at_admission():
    bm = make_bm(8)
    computed(bm, "a", [1, 2, 3, 4, 5])
    hit = bm.find_prefix([1, 2, 3, 4, 5], max_tokens=4)
    bm.allocate("b", 3)
    with pytest.raises(ValueError):
        bm.share("b", hit)
    bm.check_invariants()


# -- find_prefix ---------------------------------------------------------------------------


def test_find_prefix_matches_only_full_computed_published_blocks():
    bm = make_bm(8)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    bm.allocate("a", len(tokens))
    # Allocated but not computed/published: nothing to share.
    assert bm.find_prefix(tokens + [0], max_tokens=10) is None
    # Computed 3 tokens: no full block yet.
    bm.publish_full_blocks("a", tokens, 3)
    assert bm.find_prefix(tokens + [0], max_tokens=10) is None
    # Computed 6: one full block.
    bm.publish_full_blocks("a", tokens, 6)
    hit = bm.find_prefix(tokens + [0], max_tokens=10)
    assert hit is not None and hit.num_tokens == 4 and hit.block_ids == bm.block_table("a")[:1]
    # Computed all 10: two full blocks; the partial third is never published.
    bm.publish_full_blocks("a", tokens, 10)
    hit = bm.find_prefix(tokens + [0], max_tokens=10)
    assert hit is not None and hit.num_tokens == 8
    assert bm.blocks[bm.block_table("a")[2]].block_hash is None
    # The partial block is never matched even when the query has it.
    hit = bm.find_prefix(tokens + [11, 12], max_tokens=12)
    assert hit is not None and hit.num_tokens == 8
    # A prefix that diverges inside the first block matches nothing.
    assert bm.find_prefix([1, 2, 3, 99, 5, 6, 7, 8, 9], max_tokens=8) is None
    # Diverging inside the second block matches the first only.
    hit = bm.find_prefix([1, 2, 3, 4, 5, 6, 99, 8, 9], max_tokens=8)
    assert hit is not None and hit.num_tokens == 4


def test_publish_never_goes_beyond_the_table():
    bm = make_bm(8)
    bm.allocate("a", 4)
    # More computed tokens than blocks held (a caller bug) must not index past the table.
    bm.publish_full_blocks("a", list(range(12)), 12)
    hit = bm.find_prefix(list(range(12)), max_tokens=11)
    assert hit is not None and hit.num_tokens == 4
    bm.publish_full_blocks("nobody", list(range(8)), 8)  # no table: nothing happens
    bm.check_invariants()


def test_find_prefix_never_covers_the_last_token():
    """The scheduler passes max_tokens = num_tokens - 1: the last token's logits are needed."""
    bm = make_bm(8)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    computed(bm, "a", tokens)
    # The same 8 tokens again: only the first block may be shared, the last token is recomputed.
    hit = bm.find_prefix(tokens, max_tokens=len(tokens) - 1)
    assert hit is not None and hit.num_tokens == 4
    # With room for it, both blocks match.
    hit = bm.find_prefix(tokens, max_tokens=len(tokens))
    assert hit is not None and hit.num_tokens == 8
    # A 4-token request identical to the first block: nothing to share.
    assert bm.find_prefix(tokens[:4], max_tokens=3) is None
    assert bm.find_prefix(tokens[:5], max_tokens=4).num_tokens == 4
    assert bm.find_prefix(tokens, max_tokens=0) is None


@pytest.mark.parametrize("max_tokens", range(0, 20))
def test_find_prefix_respects_max_tokens(max_tokens):
    bm = make_bm(8)
    tokens = list(range(16))
    computed(bm, "a", tokens)
    hit = bm.find_prefix(tokens + [99], max_tokens=max_tokens)
    expected = min(max_tokens, 16) // BS * BS
    assert (hit.num_tokens if hit else 0) == expected


def test_chain_hash_depends_on_parent():
    a = chain_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = chain_block_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert len(a) == len(b) == 2
    assert a[1] != b[1]  # same block tokens, different parents
    assert chain_block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == a  # partial tail ignored
    assert chain_block_hashes([1, 2, 3], 4) == []
    assert chain_block_hashes([1, 2, 3, 4], 4) == a[:1]

    # So a block whose own tokens match but whose parent does not is never shared.
    bm = make_bm(8)
    computed(bm, "a", [9, 9, 9, 9, 5, 6, 7, 8])
    assert bm.find_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0], max_tokens=8) is None
    computed(bm, "b", [1, 2, 3, 4])
    hit = bm.find_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0], max_tokens=8)
    assert hit is not None and hit.num_tokens == 4 and hit.source == "b"


def _colliding_hash_block(parent_hash, block_token_ids):
    """Every chain at block i hashes to i + 1, whatever its tokens: the worst possible hash function."""
    return parent_hash + 1


def test_hash_collision_never_shares_other_tokens(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block", _colliding_hash_block)
    bm = make_bm(8)
    computed(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8])
    # Same hashes, different tokens: the stored token ids must veto the match.
    assert bm.find_prefix([1, 2, 3, 9, 5, 6, 7, 8, 0], max_tokens=8) is None
    hit = bm.find_prefix([1, 2, 3, 4, 9, 9, 9, 9, 0], max_tokens=8)
    assert hit is not None and hit.num_tokens == 4 and hit.block_ids == bm.block_table("a")[:1]


def test_hash_collision_in_the_parent_chain_never_shares_other_tokens(monkeypatch):
    """The source's blocks, not just the blocks the hash map points at, must hold the query's tokens.

    `a` published only [1,2,3,4]; `b` published [9,9,9,9][5,6,7,8]. Under colliding
    hashes, block 0 of the query maps to a's block and block 1 to b's block, and
    each one's own tokens match the query -- but b's cells for positions 0..3 hold
    9s. Sharing b's first two blocks would hand the query wrong KV.
    """
    monkeypatch.setattr(bm_module, "hash_block", _colliding_hash_block)
    bm = make_bm(8)
    computed(bm, "a", [1, 2, 3, 4])
    computed(bm, "b", [9, 9, 9, 9, 5, 6, 7, 8])
    query = [1, 2, 3, 4, 5, 6, 7, 8, 0]
    hit = bm.find_prefix(query, max_tokens=8)
    if hit is not None:
        assert hit.block_ids == bm.block_table(hit.source)[: len(hit.block_ids)]
        for i, block_id in enumerate(hit.block_ids):
            assert bm.blocks[block_id].token_ids == tuple(query[i * BS : (i + 1) * BS])


def test_freed_blocks_leave_the_hash_map():
    bm = make_bm(4)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    computed(bm, "a", tokens)
    assert len(bm._hashed) == 2
    bm.free("a")
    assert bm._hashed == {}
    assert all(b.block_hash is None and b.token_ids == () for b in bm.blocks)
    assert bm.find_prefix(tokens + [0], max_tokens=8) is None
    # Reused blocks carry no stale identity.
    computed(bm, "b", [5, 5, 5, 5, 6, 6, 6, 6])
    assert bm.find_prefix(tokens + [0], max_tokens=8) is None
    bm.check_invariants()


def test_duplicate_content_published_twice_stays_consistent():
    """Two sequences that computed the same prefix independently (admitted in one step)."""
    bm = make_bm(8)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    computed(bm, "a", tokens)
    computed(bm, "b", tokens)
    bm.check_invariants()
    assert [next(iter(bm._hashed[h])) for h in chain_block_hashes(tokens, BS)] == bm.block_table("a")
    bm.free("a")
    bm.check_invariants()
    # b's twin blocks stay mapped, so the prefix that is still live stays shareable.
    hit = bm.find_prefix(tokens + [0], max_tokens=8)
    assert hit is not None and hit.source == "b" and hit.block_ids == bm.block_table("b")
    bm.check_invariants()
    bm.free("b")
    assert bm._hashed == {} and bm.num_free_blocks == 8


def test_prefix_hit_is_a_plain_dataclass():
    hit = PrefixHit("a", [0, 1], 8)
    assert hit.source == "a" and hit.block_ids == [0, 1] and hit.num_tokens == 8


# -- property: a state machine over several sequences --------------------------------------

# A tiny vocabulary so that random sequences share prefixes often.
TOKENS = st.lists(st.integers(0, 1), min_size=1, max_size=6)


class BlockManagerMachine(RuleBasedStateMachine):
    """Model of what the scheduler does with a BlockManager, checked after every rule.

    Each live sequence has its tokens, the number of tokens its table must cover
    (`allocated`) and the number whose KV is computed (`computed`); computed
    blocks are published the way `Scheduler.on_step_done` does.
    """

    @initialize(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 3, 4]))
    def setup(self, num_blocks, block_size):
        self.bm = BlockManager(num_blocks, block_size)
        self.seqs: dict[int, dict] = {}  # seq -> {"tokens", "allocated", "computed"}
        self.next_id = 0

    # -- rules -----------------------------------------------------------------------------

    @rule(tokens=TOKENS, chunk=st.integers(1, 12), use_prefix=st.booleans())
    def admit(self, tokens, chunk, use_prefix):
        """A new sequence: maybe share a cached prefix, then allocate its first chunk (all or nothing)."""
        seq = self.next_id
        self.next_id += 1
        cached = 0
        hit = self.bm.find_prefix(tokens, max_tokens=len(tokens) - 1) if use_prefix else None
        if hit is not None:
            self._check_hit(hit, tokens, len(tokens) - 1)
            cached = hit.num_tokens
        target = min(len(tokens), cached + chunk)
        bs = self.bm.block_size
        needed = -(-target // bs) - (len(hit.block_ids) if hit else 0)
        if needed > self.bm.num_free_blocks:
            return  # the scheduler would leave it waiting; nothing changes
        if hit is not None:
            self.bm.share(seq, hit)
        free_before = self.bm.num_free_blocks
        new_ids = self.bm.allocate(seq, target)
        assert new_ids is not None and len(new_ids) == needed
        assert self.bm.num_free_blocks == free_before - needed
        self.seqs[seq] = {"tokens": list(tokens), "allocated": target, "computed": cached}

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), chunk=st.integers(1, 9))
    def grow(self, data, chunk):
        """Schedule the next chunk of a sequence: allocate for it, all or nothing."""
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        s = self.seqs[seq]
        target = min(len(s["tokens"]), s["computed"] + chunk)
        table_before = self.bm.block_table(seq)
        free_before = self.bm.num_free_blocks
        needed = self.bm.num_blocks_needed(seq, target)
        new_ids = self.bm.allocate(seq, target)
        if new_ids is None:
            assert needed > free_before
            assert self.bm.block_table(seq) == table_before, "a failed allocate changed the table"
            assert self.bm.num_free_blocks == free_before, "a failed allocate took blocks"
            return
        assert len(new_ids) == needed
        assert self.bm.block_table(seq) == table_before + new_ids
        assert not set(new_ids) & set(table_before)
        s["allocated"] = max(s["allocated"], target)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def compute(self, data):
        """The step ran: the allocated tokens are computed; publish full blocks."""
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        s = self.seqs[seq]
        s["computed"] = max(s["computed"], s["allocated"])
        self.bm.publish_full_blocks(seq, s["tokens"], s["computed"])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), new=st.lists(st.integers(0, 1), min_size=1, max_size=3))
    def append(self, data, new):
        """A token was sampled (only once the sequence caught up, as in the engine)."""
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        s = self.seqs[seq]
        if s["computed"] == len(s["tokens"]):
            s["tokens"].extend(new)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        """The sequence finished or was aborted."""
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        self.bm.free(seq)
        del self.seqs[seq]
        assert self.bm.block_table(seq) == []

    @precondition(lambda self: self.seqs)
    @rule()
    def preempt_newest(self):
        """Free the newest sequence and readmit it from scratch (recompute), like the scheduler."""
        seq = max(self.seqs)
        tokens = self.seqs.pop(seq)["tokens"]
        self.bm.free(seq)
        self.admit(tokens, chunk=len(tokens), use_prefix=True)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free_twice(self, data):
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        self.bm.free(seq)
        self.bm.free(seq)  # a second free is a no-op, never a double free
        del self.seqs[seq]

    @rule(tokens=TOKENS)
    def lookup(self, tokens):
        hit = self.bm.find_prefix(tokens, max_tokens=len(tokens) - 1)
        if hit is not None:
            self._check_hit(hit, tokens, len(tokens) - 1)

    # -- checks ----------------------------------------------------------------------------

    def _check_hit(self, hit, tokens, max_tokens):
        bs = self.bm.block_size
        assert 0 < hit.num_tokens <= max_tokens
        assert hit.num_tokens == len(hit.block_ids) * bs
        assert hit.source in self.seqs
        src = self.seqs[hit.source]
        # The source's own blocks, whose cells it has computed, holding exactly these tokens.
        assert self.bm.block_table(hit.source)[: len(hit.block_ids)] == hit.block_ids
        assert src["computed"] >= hit.num_tokens
        assert src["tokens"][: hit.num_tokens] == list(tokens[: hit.num_tokens])
        for i, block_id in enumerate(hit.block_ids):
            assert self.bm.blocks[block_id].token_ids == tuple(tokens[i * bs : (i + 1) * bs])

    @invariant()
    def books_balance(self):
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        bm.check_invariants()
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        assert 0 <= bm.num_free_blocks <= bm.num_blocks
        held = {b for seq in self.seqs for b in bm.block_table(seq)}
        assert len(held) == bm.num_used_blocks, "a block is used but held by no live sequence"
        for seq, s in self.seqs.items():
            table = bm.block_table(seq)
            assert len(table) == len(set(table)), "a sequence holds a block twice"
            # The table covers the sequence's allocated tokens, and no more than one block past them.
            assert len(table) * bm.block_size >= s["allocated"]
            assert len(table) == -(-s["allocated"] // bm.block_size)
            assert s["computed"] <= s["allocated"] <= len(s["tokens"])
            for i, block_id in enumerate(table):
                block = bm.blocks[block_id]
                assert seq in block.holders
                if block.block_hash is not None:
                    # A published block holds this sequence's tokens at that position, computed.
                    assert (i + 1) * bm.block_size <= s["computed"]
                    assert block.token_ids == tuple(s["tokens"][i * bm.block_size : (i + 1) * bm.block_size])
        for block_hash, twins in bm._hashed.items():
            assert twins and all(bm.blocks[block_id].block_hash == block_hash for block_id in twins)

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq in list(self.seqs):
            self.bm.free(seq)
        self.bm.check_invariants()
        assert self.bm.num_free_blocks == self.bm.num_blocks
        assert self.bm._hashed == {}
        assert all(not b.holders and b.block_hash is None for b in self.bm.blocks)


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockManagerMachine = BlockManagerMachine.TestCase


class CollidingHashMachine(BlockManagerMachine):
    """The same workload under the worst hash function: token ids alone must keep sharing correct."""

    @initialize(num_blocks=st.integers(2, 12), block_size=st.sampled_from([1, 2]))
    def setup(self, num_blocks, block_size):
        self._real_hash = bm_module.hash_block
        bm_module.hash_block = _colliding_hash_block
        self.bm = BlockManager(num_blocks, block_size)
        self.seqs = {}
        self.next_id = 0

    def teardown(self):
        try:
            super().teardown()
        finally:
            if hasattr(self, "_real_hash"):
                bm_module.hash_block = self._real_hash


CollidingHashMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCollidingHashMachine = CollidingHashMachine.TestCase


def test_publishing_hashes_only_the_blocks_filled_since_the_last_call(monkeypatch):
    """nano-vllm's incremental hashing: a long sequence's step costs its new blocks, not its chain."""
    calls = []
    real = bm_module.hash_block
    monkeypatch.setattr(
        bm_module, "hash_block", lambda parent, tokens: calls.append(tuple(tokens)) or real(parent, tokens)
    )
    bm = make_bm(16)
    tokens = list(range(100, 100 + 6 * BS))
    bm.allocate("a", len(tokens))
    for computed_tokens in range(1, len(tokens) + 1):
        bm.publish_full_blocks("a", tokens, computed_tokens)
    assert len(calls) == 6  # once per block, however many steps it took
    # The incremental chain equals the chain computed from scratch.
    assert [bm.blocks[b].block_hash for b in bm.block_table("a")] == chain_block_hashes(tokens, BS)
    hit = bm.find_prefix(tokens + [0], max_tokens=len(tokens))
    assert hit is not None and hit.num_tokens == len(tokens)
    bm.check_invariants()


def test_a_shared_prefix_is_not_hashed_again_by_the_sharer():
    bm = make_bm(16)
    prefix = list(range(1, 2 * BS + 1))
    computed(bm, "a", prefix)
    hit = bm.find_prefix(prefix + [7, 7], max_tokens=2 * BS)
    bm.share("b", hit)
    bm.allocate("b", 2 * BS + BS)
    bm.publish_full_blocks("b", prefix + [7] * BS, 3 * BS)
    assert len(bm._hashed) == 3  # a's two blocks and b's own third
    bm.free("a")
    bm.check_invariants()
    assert bm.find_prefix(prefix + [7] * BS + [0], max_tokens=3 * BS).num_tokens == 3 * BS
