"""The evictable-leaf heaps: exact LRU victims and a heap that does not grow with touches.

Recency never pushes heap entries (``touch`` only raises ``last_access``); ``pop_leaf`` re-files
a touched entry when it surfaces. These tests drive requests with many touches of the same
leaves and check every victim against a scan of the leaf set, and the heap's size against the
set's.
"""

from __future__ import annotations

import heapq
import random

import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.leaves import entry_id, heap_entry
from radixscope.cache.tiers import DEVICE, HOST
from tests.kits.cachekit import make_config


def _lru_by_scan(c: HiRadixCache, tier: int):
    live = c.leaves[tier]
    return min(((c.tree.nodes[i].last_access, i) for i in live), default=None)


def _request(c: HiRadixCache, tokens: list[int], rid: str) -> None:
    m = c.match_prefix(tokens, req_id=rid)
    r = c.lock(m.last_device_node, owner=rid)
    n = len(tokens) - m.device_prefix_len
    if n > c.available():
        c.evict(n - c.available())
    idx = c.alloc(n)
    if idx is None:  # everything left is pinned by this request
        c.unlock(r)
        return
    c.insert(tokens, torch.cat([m.device_indices, idx]), prev_prefix_len=m.device_prefix_len)
    c.unlock(r)


def test_every_victim_is_the_lru_leaf_and_the_heap_stays_small() -> None:
    rng = random.Random(1234)
    c = HiRadixCache(make_config(device_tokens=512, host_tokens=0, write_policy="write_back"))
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 24))] for _ in range(40)]
    victims = 0
    for step in range(3000):
        p = rng.choice(prompts)
        if rng.random() < 0.7:  # touch a cached prefix again (recency only)
            c.match_prefix(p[:rng.randrange(1, len(p) + 1)])
            continue
        if rng.random() < 0.3:
            want = _lru_by_scan(c, DEVICE)
            out = c.evict(1)
            if want is not None:
                assert out.evicted_nodes and out.evicted_nodes[0] == want[1], (step, want, out)
                victims += 1
            continue
        _request(c, p + [rng.randrange(50, 99) for _ in range(rng.randrange(1, 6))], f"r{step}")
        heap, live = c._heaps[DEVICE], c.leaves[DEVICE]
        # one entry per node at most: the heap is bounded by the nodes, not by the touches
        assert len(heap) <= len(c.tree.nodes), (len(heap), len(c.tree.nodes))
        assert all(c.tree.nodes[i].in_heap & (1 << DEVICE) for i in live)
    c.check()
    assert victims > 200


def test_host_heap_victims_are_lru_after_touches() -> None:
    rng = random.Random(99)
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=256))
    keys = [[k, *(rng.randrange(1, 9) for _ in range(7))] for k in range(1, 40)]
    for i, k in enumerate(keys):
        _request(c, k, f"a{i}")
        c.poll(wait=True)
    for _ in range(200):  # host-only leaves touched through matches (no load-back)
        c.match_prefix(rng.choice(keys))
    checked = 0
    while c.leaves[HOST]:
        want = _lru_by_scan(c, HOST)
        out = c.evict_host(1)
        assert out.evicted_nodes[0] == want[1]
        checked += 1
    assert checked > 5
    c.check()


def test_touches_do_not_grow_the_heap() -> None:
    """Matches only raise recency: 2000 of them over the cached leaves add no heap entry (the
    old scheme pushed one per touched leaf and rebuilt the heap in ``touch`` every few thousand
    touches: an O(leaves) pause inside a match)."""
    rng = random.Random(7)
    c = HiRadixCache(make_config(device_tokens=4096, host_tokens=0))
    keys = [[k, *(rng.randrange(1, 9) for _ in range(15))] for k in range(1, 120)]
    for i, k in enumerate(keys):
        _request(c, k, f"a{i}")
    before = len(c._heaps[DEVICE])
    assert before >= len(c.leaves[DEVICE]) >= 100
    for _ in range(2000):
        c.match_prefix(rng.choice(keys))
    assert len(c._heaps[DEVICE]) == before
    want = _lru_by_scan(c, DEVICE)
    assert c.evict(1).evicted_nodes[0] == want[1]
    c.check()


def test_check_reports_a_leaf_the_heap_lost_and_a_second_entry() -> None:
    c = HiRadixCache(make_config(device_tokens=256, host_tokens=0))
    for i in range(6):
        _request(c, [i + 1, *range(10, 20)], f"r{i}")
    c.check()
    heap = c._heaps[DEVICE]
    leaf = next(iter(c.leaves[DEVICE]))
    kept = [e for e in heap if entry_id(e) != leaf]
    heap[:] = kept
    heapq.heapify(heap)
    with pytest.raises(InvariantViolation, match="no heap entry"):
        c.check()
    heapq.heappush(heap, heap_entry(c.tree.nodes[leaf].last_access, leaf))
    c.check()
    heapq.heappush(heap, heap_entry(0, leaf))
    with pytest.raises(InvariantViolation, match="2 heap entries"):
        c.check()


def test_a_leaf_eviction_skips_stays_findable() -> None:
    """An L3 prefetch host-pins its anchor's path, device-only nodes included; eviction pops
    such a leaf and leaves it resident (a pinned node is never deleted). The popped entry must
    go back: without it the leaf, still counted evictable, could never be evicted again (until
    some match touched it), and an ``alloc`` trusting the evictable ledger ran out of memory.
    Found by the long fuzz profile (full, page 1, write_through_selective, clean L3)."""
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=0))
    _request(c, list(range(1, 33)), "a")
    _request(c, list(range(100, 132)), "b")
    leaf = c.tree.nodes[c.match_prefix(list(range(1, 33))).last_device_node]
    entry = c.acquire(leaf, HOST, {0: [leaf]}, "prefetch:p1")  # as a prefetch's anchor pin
    out = c.evict(64)
    assert leaf.id not in out.evicted_nodes and leaf.id in c.leaves[DEVICE]
    c.check()  # every evictable leaf still has its heap entry
    c.release(c.locks[entry])
    assert c.evict(32).evicted_nodes == (leaf.id,)
    c.check()


def test_a_compacted_heap_still_gives_lru_victims() -> None:
    """Entries of nodes that left the set pile up (here: 1,100 leaves all locked at once) until
    ``_compact_heaps`` rebuilds the heap from the set; the leaves filed again on unlock must
    still come out in exact LRU order, and ``check()`` must hold throughout."""
    c = HiRadixCache(make_config(device_tokens=4 * 1200, host_tokens=0))
    keys = [[k // 64 + 1, k % 64 + 1, 7, 7] for k in range(1100)]
    for i, k in enumerate(keys):
        _request(c, k, f"a{i}")
    heap = c._heaps[DEVICE]
    assert len(c.leaves[DEVICE]) == len(heap) == 1100
    receipts = [c.lock(c.match_prefix(k).last_device_node, owner=f"l{i}")
                for i, k in enumerate(keys)]
    assert not c.leaves[DEVICE] and len(heap) == 1100  # stale entries, not yet dropped
    _request(c, [999, 1, 2, 3], "late")  # its leaf's entry tips the heap over the bound
    assert len(heap) == len(c.leaves[DEVICE]) == 1
    c.check()
    rng = random.Random(5)
    for i in rng.sample(range(len(receipts)), len(receipts)):  # unlocked in random order
        c.unlock(receipts[i])
    for k in rng.sample(keys, 300):  # and some touched again
        c.match_prefix(k)
    c.check()
    while c.leaves[DEVICE]:
        want = _lru_by_scan(c, DEVICE)
        assert c.evict(1).evicted_nodes[0] == want[1]
    c.check()
