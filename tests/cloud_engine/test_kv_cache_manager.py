"""The cloud engine's block pool and KV cache manager: tables, reference counts, prefix cache, LRU."""

from __future__ import annotations

import pytest

from cloud_engine.block_manager import KVCacheManager
from cloud_engine.block_pool import BlockHash, BlockPool, hash_block
from tests.cloud_engine.conftest import BS, make_request


def make_kv(num_blocks: int = 8, block_size: int = BS, enable_prefix_caching: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, enable_prefix_caching)


def admit(kv: KVCacheManager, request, num_new_tokens: int | None = None) -> list[int]:
    """What the scheduler does at admission: look up the cache, take the blocks, compute, publish."""
    computed_ids, num_cached = kv.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - num_cached
    assert kv.allocate_slots(request, num_new_tokens, computed_ids) is not None
    request.num_computed_tokens = num_cached + num_new_tokens
    kv.cache_full_blocks(request)
    kv.check_invariants()
    return kv.get_block_ids(request.request_id)


# -- hashing -------------------------------------------------------------------------------


def test_block_hash_chains_over_the_parent_and_compares_tokens():
    a = hash_block(None, [1, 2, 3, 4])
    assert a == hash_block(None, (1, 2, 3, 4)) and hash(a) == hash(hash_block(None, [1, 2, 3, 4]))
    assert a != hash_block(None, [1, 2, 3, 5])
    b = hash_block(a, [5, 6, 7, 8])
    assert b != hash_block(None, [5, 6, 7, 8]), "the same tokens after another prefix are another block"
    assert b != hash_block(hash_block(None, [9, 9, 9, 9]), [5, 6, 7, 8])
    # Equal digests are not enough: the block's own tokens must match too.
    assert BlockHash(b.digest, (5, 6, 7, 9)) != b


def test_a_digest_collision_never_returns_a_block_with_other_tokens():
    kv = make_kv()
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=2)
    admit(kv, a)
    cached = a.block_hashes[0]
    # b's first block has other tokens but (as if by a collision) the same digest as a's.
    b = make_request("b", [7, 7, 7, 7, 5, 6, 7, 8, 9], max_tokens=2)
    b.block_hashes.append(BlockHash(cached.digest, (7, 7, 7, 7)))
    assert kv.get_computed_blocks(b) == ([], 0)


# -- allocation ----------------------------------------------------------------------------


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 4)])
def test_rejects_empty_pool_or_blocks(num_blocks, block_size):
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks, block_size)


def test_fresh_pool_is_all_free():
    kv = make_kv(5)
    assert kv.num_free_blocks == 5 and kv.num_used_blocks == 0 and kv.usage == 0.0
    assert kv.get_block_ids("nobody") == [] and kv.can_allocate(5) and not kv.can_allocate(6)
    kv.check_invariants()


def test_allocate_slots_grows_on_demand():
    kv = make_kv(8)
    r = make_request("a", 3)
    first = kv.allocate_slots(r, 3)
    assert first is not None and len(first) == 1
    r.num_computed_tokens = 3
    assert kv.allocate_slots(r, 1) == []  # the 4th token still fits the first block
    second = kv.allocate_slots(r, 2)  # tokens 4 and 5: one more block
    assert second is not None and len(second) == 1
    r.num_computed_tokens = 5
    third = kv.allocate_slots(r, 9)  # up to 14 tokens: 4 blocks in all
    assert len(third) == 2 and kv.get_block_ids("a") == first + second + third
    assert kv.num_used_blocks == 4 and kv.usage == 0.5
    kv.check_invariants()


def test_allocate_slots_returns_none_and_changes_nothing_when_short():
    kv = make_kv(3)
    a, b = make_request("a", 8), make_request("b", 8)
    assert kv.allocate_slots(a, 8) is not None
    free_before = kv.pool.free_block_ids()
    assert kv.allocate_slots(b, 8) is None
    assert kv.get_block_ids("b") == [] and kv.pool.free_block_ids() == free_before
    kv.check_invariants()


def test_free_returns_every_block_and_unknown_free_is_a_no_op():
    kv = make_kv(4)
    r = make_request("a", 10)
    kv.allocate_slots(r, 10)
    kv.free(r)
    kv.free(r)
    kv.free("nobody")
    assert kv.num_free_blocks == 4 and kv.num_used_blocks == 0
    kv.check_invariants()


def test_pool_refuses_a_double_free():
    pool = BlockPool(2)
    (block_id,) = pool.allocate(1)
    pool.free([block_id])
    with pytest.raises(RuntimeError):
        pool.free([block_id])


def test_computed_blocks_only_at_admission():
    kv = make_kv(8)
    a = make_request("a", [1, 2, 3, 4, 5], max_tokens=2)
    admit(kv, a)
    b = make_request("b", [1, 2, 3, 4, 6], max_tokens=2)
    ids, _ = kv.get_computed_blocks(b)
    kv.allocate_slots(b, 1)
    with pytest.raises(ValueError):
        kv.allocate_slots(b, 1, ids)


def test_check_invariants_catches_a_wrong_reference_count():
    kv = make_kv(4)
    kv.allocate_slots(make_request("a", 4), 4)
    kv.pool.blocks[kv.get_block_ids("a")[0]].ref_count = 2
    with pytest.raises(AssertionError):
        kv.check_invariants()


# -- prefix cache --------------------------------------------------------------------------


def test_prefix_hit_shares_blocks_and_counts_references_and_tokens():
    kv = make_kv(16)
    common = list(range(1, 11))  # 2 full blocks + 2 tokens
    a = make_request("a", common + [50, 51])
    a_blocks = admit(kv, a)
    assert kv.pool.num_cached_blocks == 3  # all 12 tokens computed: 3 full blocks
    b = make_request("b", common + [60, 61, 62])
    ids, num_cached = kv.get_computed_blocks(b)
    assert ids == a_blocks[:2] and num_cached == 8
    new_ids = kv.allocate_slots(b, b.num_tokens - num_cached, ids)
    assert len(new_ids) == 2  # 13 tokens: 4 blocks, 2 of them shared
    assert kv.get_block_ids("b") == a_blocks[:2] + new_ids
    assert [kv.pool.blocks[i].ref_count for i in a_blocks] == [2, 2, 1]
    assert kv.num_prefix_cache_queries_total == 12 + 13
    assert kv.num_prefix_cache_hits_total == 8
    kv.check_invariants()
    kv.free(a)
    assert [kv.pool.blocks[i].ref_count for i in a_blocks] == [1, 1, 0]
    kv.free(b)
    assert kv.num_used_blocks == 0
    kv.check_invariants()


def test_at_least_one_token_is_left_to_compute():
    kv = make_kv(8)
    prompt = list(range(1, 9))  # exactly 2 blocks
    admit(kv, make_request("a", prompt))
    b = make_request("b", prompt)
    ids, num_cached = kv.get_computed_blocks(b)
    assert len(ids) == 1 and num_cached == 4  # the second block is recomputed for the last token's logits


def test_a_prompt_exactly_filling_one_block():
    kv = make_kv(4)
    a = make_request("a", [1, 2, 3, 4])
    blocks = admit(kv, a)
    assert len(blocks) == 1 and kv.pool.blocks[blocks[0]].block_hash == hash_block(None, [1, 2, 3, 4])
    assert kv.get_computed_blocks(make_request("b", [1, 2, 3, 4])) == ([], 0)
    # With one more token the whole block is a hit.
    assert kv.get_computed_blocks(make_request("c", [1, 2, 3, 4, 5])) == (blocks, 4)


def test_only_full_computed_blocks_are_published():
    kv = make_kv(8)
    r = make_request("a", list(range(10)))
    kv.allocate_slots(r, 6)  # a chunk of 6: one full block and a partial one
    r.num_computed_tokens = 6
    kv.cache_full_blocks(r)
    assert kv.pool.num_cached_blocks == 1 and len(r.block_hashes) == 1
    kv.allocate_slots(r, 4)
    r.num_computed_tokens = 10
    kv.cache_full_blocks(r)
    assert kv.pool.num_cached_blocks == 2 and len(r.block_hashes) == 2
    kv.check_invariants()


def test_freed_cached_blocks_stay_reusable_and_a_hit_takes_them_off_the_free_queue():
    kv = make_kv(6)
    prompt = list(range(1, 10))  # 2 full blocks + 1
    a = make_request("a", prompt)
    a_blocks = admit(kv, a)
    kv.free(a)
    assert kv.num_free_blocks == 6 and kv.pool.num_cached_blocks == 2
    b = make_request("b", prompt + [42])
    ids, num_cached = kv.get_computed_blocks(b)
    assert ids == a_blocks[:2] and num_cached == 8
    kv.allocate_slots(b, b.num_tokens - num_cached, ids)
    assert kv.num_free_blocks == 6 - 3
    assert not set(ids) & set(kv.pool.free_block_ids())
    assert all(kv.pool.blocks[i].ref_count == 1 for i in ids)
    kv.check_invariants()


def test_reviving_free_cached_blocks_counts_against_free_blocks():
    kv = make_kv(3)
    prompt = list(range(1, 10))  # 3 blocks, 2 of them published when freed
    a = make_request("a", prompt)
    admit(kv, a)
    kv.free(a)
    c = make_request("c", 4)
    kv.allocate_slots(c, 4)  # takes the unpublished block (it was freed to the head)
    b = make_request("b", prompt + [42, 43, 44, 45])  # 2 cached blocks + 2 new ones: 4 > 3
    ids, _ = kv.get_computed_blocks(b)
    assert len(ids) == 2
    assert kv.allocate_slots(b, 5, ids) is None
    assert kv.pool.num_cached_blocks == 2 and kv.get_block_ids("b") == []
    kv.check_invariants()


def test_eviction_order_is_lru_with_a_request_tail_first_and_unpublished_blocks_before_all():
    kv = make_kv(8)
    a = make_request("a", list(range(100, 109)))  # blocks a0 a1 published, a2 partial
    b = make_request("b", list(range(200, 209)))
    a_blocks, b_blocks = admit(kv, a), admit(kv, b)
    kv.free(a)
    kv.free(b)
    free = kv.pool.free_block_ids()
    # Head: unpublished blocks (anyone's partial tails), then the rest of the never-used pool,
    # then a's published blocks tail first, then b's: the least recently freed go first.
    assert set(free[:2]) == {a_blocks[2], b_blocks[2]}
    assert free[-4:] == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    # Allocating everything but 3 blocks evicts a's cached blocks (last block first) before b's.
    c = make_request("c", 4 * 5)
    kv.allocate_slots(c, 20)
    assert kv.pool.num_cached_blocks == 3 and kv.pool.num_evictions_total == 1
    assert kv.get_computed_blocks(make_request("a2", list(range(100, 109)))) == ([a_blocks[0]], 4)
    assert kv.get_computed_blocks(make_request("b2", list(range(200, 209)))) == (b_blocks[:2], 8)
    kv.check_invariants()


def test_twins_computed_side_by_side_publish_one_block():
    kv = make_kv(8)
    prompt = list(range(1, 6))
    a, b = make_request("a", prompt), make_request("b", prompt)
    # Both admitted in one step before either computed: no hit, each computes its own copy.
    assert kv.get_computed_blocks(a) == ([], 0) and kv.get_computed_blocks(b) == ([], 0)
    for r in (a, b):
        kv.allocate_slots(r, 5)
    for r in (a, b):
        r.num_computed_tokens = 5
        kv.cache_full_blocks(r)
    assert kv.pool.num_cached_blocks == 1
    assert kv.pool.get_cached_block(a.block_hashes[0]) == kv.get_block_ids("a")[0]
    kv.check_invariants()


def test_prefix_caching_off_hashes_and_reuses_nothing():
    kv = make_kv(8, enable_prefix_caching=False)
    prompt = list(range(1, 10))
    a = make_request("a", prompt)
    admit(kv, a)
    assert a.block_hashes == [] and kv.pool.num_cached_blocks == 0
    kv.free(a)
    assert kv.get_computed_blocks(make_request("b", prompt)) == ([], 0)
    assert kv.num_prefix_cache_queries_total == 0 and kv.num_prefix_cache_hits_total == 0
    kv.check_invariants()


def test_reset_prefix_cache_forgets_only_free_blocks():
    kv = make_kv(8)
    a, b = make_request("a", list(range(1, 10))), make_request("b", list(range(20, 29)))
    admit(kv, a)
    admit(kv, b)
    kv.free(a)
    assert kv.reset_prefix_cache() == 2
    assert kv.pool.num_cached_blocks == 2  # b's, still held
    assert kv.get_computed_blocks(make_request("a2", list(range(1, 10)))) == ([], 0)
    kv.check_invariants()
