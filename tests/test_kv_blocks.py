"""The K/V block pool: reference counts, shared prefixes by chain hash, eviction order."""

from __future__ import annotations

import pytest

from llmplan.runtime.kv_blocks import BlockPool, block_hashes


def test_chain_hashes_name_whole_prefixes():
    a, b = list(range(40)), list(range(32)) + [99] * 8
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert len(ha) == 2 and ha == hb  # the third block is not full
    assert block_hashes([7] + a[1:32], 16)[1] != ha[1]  # block 1 also names what came before it


def test_allocate_share_release_and_evict():
    pool = BlockPool(4, 16)
    x = pool.allocate(3)
    assert pool.free_blocks == 1 and pool.allocate(2) is None
    hashes = block_hashes(list(range(48)), 16)
    for b, h in zip(x, hashes):
        pool.publish(b, h)
    assert pool.cached_prefix(hashes[:2] + [b"other"]) == x[:2]
    pool.take(x[:2])  # a second sequence shares the first two blocks
    pool.release(x)
    assert pool.free_blocks == 2 and pool.refs[x[0]] == 1  # x[2] is free but still cached
    assert pool.stats().cached == 1 and pool.cached_prefix(hashes) == x
    fresh = pool.allocate(1)
    assert fresh != [x[2]]  # blocks caching nothing go first
    assert pool.allocate(1) == [x[2]] and pool.cached_prefix(hashes) == x[:2]  # evicted: forgets its prefix
    pool.release(x[:2])
    pool.release(fresh + [x[2]])
    assert pool.free_blocks == pool.total == 4
    with pytest.raises(AssertionError, match="released more often"):
        pool.release(fresh)
