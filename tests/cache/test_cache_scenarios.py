"""Scenario tests for the FULL component: exact node ids, eviction order and tier per node."""

from __future__ import annotations

import torch

from radixscope.cache import CacheOutOfMemory, HiRadixCache
from tests.kits.cachekit import Driver, make_config, parents, states


def full_cache(**kw) -> tuple[HiRadixCache, Driver]:
    kw.setdefault("device_tokens", 16)
    kw.setdefault("host_tokens", 32)
    c = HiRadixCache(make_config(("full",), **kw))
    return c, Driver(c)


def test_match_insert_split_ids_and_lengths():
    c, d = full_cache()
    assert d.insert([1, 2, 3, 4]).last_node == 1
    r = d.insert([1, 2, 5, 6])
    assert (r.prefix_len, r.last_node, r.new_tokens) == (2, 3, 2)
    assert parents(c) == {1: 2, 2: 0, 3: 2}  # node 2 = [1, 2] split off node 1
    m = c.match_prefix([1, 2, 3, 9])
    assert (m.device_prefix_len, m.last_device_node, m.best_match_node) == (3, 4, 4)
    assert parents(c) == {1: 4, 2: 0, 3: 2, 4: 2}  # the match split node 1 after one token
    assert m.device_indices.tolist() == [0, 1, 2]
    assert c.snapshot().node(4).tokens == (3,)
    c.check()


def test_insert_returns_present_length_and_frees_duplicates():
    c, d = full_cache()
    d.insert([1, 2, 3, 4])
    before = c.available()
    dup = c.alloc(4)
    r = c.insert([1, 2, 3, 4], dup)
    assert (r.prefix_len, r.new_tokens, r.last_node) == (4, 0, 1)
    assert c.available() == before  # the four duplicate slots came back
    c.check()


def test_namespaces_are_disjoint_subtrees():
    c, d = full_cache()
    d.insert([1, 2, 3, 4], extra_key="lora-a")
    d.insert([1, 2, 3, 4], extra_key="lora-b")
    assert parents(c) == {1: 0, 2: 0}
    assert c.match_prefix([1, 2, 3], extra_key="lora-a").device_prefix_len == 3
    assert c.match_prefix([1, 2, 3]).device_prefix_len == 0
    c.check()


def test_page_size_truncates_keys_and_splits_on_pages():
    c = HiRadixCache(make_config(("full",), page_size=4, device_tokens=32, host_tokens=64))
    d = Driver(c)
    r = d.insert(list(range(10)))  # truncated to 8 tokens
    assert (r.key_len, r.last_node) == (8, 1)
    m = c.match_prefix([0, 1, 2, 3, 4, 5, 9, 9])
    assert m.device_prefix_len == 4  # 6 tokens agree, rounded down to one page
    assert parents(c) == {1: 2, 2: 0}
    c.check()


def test_lru_eviction_order_and_demotion_with_backup():
    c, d = full_cache()
    for key in ([1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]):
        d.insert(key)
    c.poll()
    c.match_prefix([1, 1, 1, 1])  # node 1 becomes most recent
    r = c.evict(8)
    assert r.evicted_nodes == (2, 3) and r.demoted == (2, 3) and r.deleted == ()
    assert states(c) == {1: "device+host", 2: "host", 3: "host"}
    assert c.available() == 16 - 4
    c.check()


def test_eviction_without_host_tier_deletes_nodes():
    c, d = full_cache(host_tokens=0)
    d.insert([1, 2, 3, 4])
    d.insert([1, 2, 5, 6])
    r = c.evict(2)
    assert r.deleted == (1,) and r.demoted == ()
    assert parents(c) == {2: 0, 3: 2}
    r = c.evict(100)
    assert r.evicted_nodes == (3, 2) and r.freed_of("full") == 4
    assert parents(c) == {}
    c.check()


def test_lock_pins_path_and_skips_evicted_bottom_segment():
    c, d = full_cache()
    d.insert([1, 2, 3, 4])
    d.insert([1, 2, 3, 4, 5, 6, 7, 8])
    c.poll()
    c.evict(4)  # the leaf [5..8] (node 2) becomes host-only
    assert states(c) == {1: "device+host", 2: "host"}
    rc = c.lock(2, owner="req-7")
    assert rc.skipped == (2,) and rc.pins == (("full", (1,)),)
    snap = c.snapshot()
    assert snap.node(1).components[0].lock_ref == 1 and snap.node(2).components[0].lock_ref == 0
    assert snap.locks[0].owner == "req-7"
    m = c.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    lb = c.load_back(m)
    c.poll([lb.transfer_id])
    c.unlock(rc)  # must not touch node 2, which the lock skipped
    snap = c.snapshot()
    assert [n.components[0].lock_ref for n in snap.nodes[1:]] == [0, 0]
    assert c.evictable[0][0] == 8 and c.protected[0][0] == 0
    c.check()


def test_locked_nodes_are_not_evicted_and_alloc_reports_numbers():
    c, d = full_cache()
    r = d.insert(list(range(12)))
    c.poll()  # until acked, the write-through backup itself pins the node
    rc = c.lock(r.last_node)
    try:
        c.alloc(8)
        raise AssertionError("expected out of memory")
    except CacheOutOfMemory as e:
        assert (e.requested, e.available, e.evictable, e.protected) == (8, 4, 0, 12)
    c.unlock(rc)
    assert c.alloc(8).numel() == 8
    c.check()


def test_write_back_backs_up_at_eviction():
    c, d = full_cache(write_policy="write_back")
    d.insert([5, 6, 7, 8])
    assert c.transfers == {} and states(c) == {1: "device"}
    r = c.evict(4)
    assert r.demoted == (1,)
    assert states(c) == {1: "host"}
    m = c.match_prefix([5, 6, 7, 8])
    assert m.host_hit_length == 4
    lb = c.load_back(m)
    c.poll()
    assert d.verify_device_prefix([5, 6, 7, 8], lb.anchor) == 4
    c.check()


def test_write_through_selective_waits_for_the_threshold():
    c, d = full_cache(write_policy="write_through_selective", write_through_threshold=2)
    d.insert([1, 2, 3, 4])
    assert c.transfers == {}
    d.insert([1, 2, 3, 4])  # second hit on the same node
    assert len(c.transfers) == 1
    c.poll()
    assert states(c) == {1: "device+host"}
    c.check()


def test_load_back_restores_exact_content_anchored_on_best_match():
    c, d = full_cache()
    d.insert([9, 8, 7, 6, 5, 4])
    c.poll()
    c.evict(16)
    m = c.match_prefix([9, 8, 7, 6, 5, 4, 3])
    assert (m.device_prefix_len, m.host_hit_length, m.best_match_node) == (0, 6, 1)
    lb = c.load_back(m)
    snap = c.snapshot()
    assert snap.transfers[0].kind == "load_back" and snap.pool("full", "device").in_flight == 6
    c.poll()
    assert lb.device_prefix_len == 6
    assert d.verify_device_prefix([9, 8, 7, 6, 5, 4], 1) == 6
    assert torch.equal(c.path_indices(1), lb.device_indices)
    c.check()


def test_transfers_complete_in_any_order():
    c, d = full_cache()
    t1 = d.insert([1, 1]).backups[0]
    t2 = d.insert([2, 2]).backups[0]
    assert c.poll([t2]) == [t2]
    c.check()
    assert c.poll() == [t1]
    c.check()


def test_evict_host_removes_host_only_leaves_lru():
    c, d = full_cache()
    d.insert([1, 1, 1, 1])
    d.insert([2, 2, 2, 2])
    c.poll()
    c.evict(8)
    r = c.evict_host(4)
    assert r.deleted == (1,) and states(c) == {2: "host"}
    c.check()


def test_evictable_slots_is_what_an_alloc_can_count_on():
    c, d = full_cache()
    d.insert([1, 2, 3, 4])
    d.insert([5, 6, 7])
    c.poll(wait=True)  # the write-through backups done: nothing in flight
    receipt = c.lock(c.match_prefix([5, 6, 7]).last_device_node, owner="r")
    pool = next(p for p in c.snapshot().pools if (p.component, p.tier) == ("full", "device"))
    assert (c.available(), c.evictable_slots()) == (pool.available, pool.evictable) == (9, 4)
    host = next(p for p in c.snapshot().pools if (p.component, p.tier) == ("full", "host"))
    assert c.evictable_slots("full", "host") == host.evictable
    out = c.alloc(c.available() + c.evictable_slots())  # exactly fits: evicts the unlocked 4
    assert out.numel() == 13 and c.evictable_slots() == 0
    try:
        c.evictable_slots(tier="disk")
    except ValueError as e:
        assert "tier='disk'" in str(e)
    else:
        raise AssertionError("a bad tier must raise")
    c.unlock(receipt)
    c.check()
