"""SWA and MAMBA on the same tree: window validity, tombstones, healing, window locks, MAMBA
copy-on-write and the per-path cap. Exact node ids and numbers."""

from __future__ import annotations

import torch

from radixscope.cache import HiRadixCache
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import Driver, make_config, parents, state_for, states

K = list(range(1, 13))


def swa_cache(window: int = 4, page_size: int = 1, **kw) -> tuple[HiRadixCache, Driver]:
    c = HiRadixCache(make_config(("full", "swa"), page_size=page_size, device_tokens=32,
                                 host_tokens=64, sliding_window=window, swa_device_tokens=32,
                                 **kw))
    return c, Driver(c)


def chain(d: Driver) -> None:
    """Nodes 1 = K[0:4], 2 = K[4:8], 3 = K[8:12], inserted one after another."""
    for n in (4, 8, 12):
        d.insert(K[:n])
    d.c.poll()


def test_out_of_window_swa_is_tombstoned_first_and_match_validity_follows_the_window():
    c, d = swa_cache(window=4)
    chain(d)
    assert parents(c) == {1: 0, 2: 1, 3: 2}
    r = c.evict(4, component="swa")  # node 1 is outside every recently used window
    assert r.tombstoned == (("swa", 1),) and r.freed == (("full", 0), ("swa", 4))
    assert states(c, "swa") == {1: "host", 2: "device+host", 3: "device+host"}
    assert states(c, "full") == {1: "device+host", 2: "device+host", 3: "device+host"}
    m = c.match_prefix(K[:4])  # ends on the tombstone: only the host copy can serve it
    assert (m.device_prefix_len, m.best_match_node, m.swa_host_hit_length) == (0, 1, 4)
    m = c.match_prefix(K[:8])  # node 2 alone holds a whole window of 4
    assert (m.device_prefix_len, m.last_device_node, m.swa_host_hit_length) == (8, 2, 0)
    c.check()


def test_window_not_covered_on_device_needs_exactly_the_missing_tokens_from_host():
    c, d = swa_cache(window=5)
    chain(d)
    c.evict(4, component="swa")
    m = c.match_prefix(K[:8])  # 4 device SWA tokens on node 2, one more needed from node 1
    assert (m.device_prefix_len, m.last_device_node, m.best_match_node) == (0, 0, 2)
    assert m.swa_host_hit_length == 1
    lb = c.load_back(m)
    assert lb.loaded == (("full", 0), ("swa", 1))
    c.poll()
    assert parents(c) == {4: 0, 1: 4, 2: 1, 3: 2}  # node 1 cut so only its last token loads
    assert states(c, "swa")[1] == "device+host" and states(c, "swa")[4] == "host"
    assert c.match_prefix(K[:8]).device_prefix_len == 8
    d.verify_device_prefix(K[:8], 2)
    c.check()


def test_window_that_is_not_a_page_multiple_rounds_up_to_whole_pages():
    c, d = swa_cache(window=3, page_size=2)
    chain(d)
    c.evict(100)  # everything demoted to host
    m = c.match_prefix(K)
    assert (m.host_hit_length, m.swa_host_hit_length) == (12, 4)  # ceil_paged(3) = 4
    lb = c.load_back(m)
    assert lb.loaded == (("full", 12), ("swa", 4))
    c.poll()
    d.verify_device_prefix(K, m.best_match_node)
    c.check()


def test_insert_heals_swa_tombstones_inside_the_live_window():
    c, d = swa_cache(window=4)
    chain(d)
    c.evict(4, component="swa")
    assert states(c, "swa")[1] == "host"
    swa_before = c.available("swa")
    full = c.alloc(4)
    swa = c.alloc(4, component="swa")
    r = c.insert(K[:4], full, swa_indices=swa)
    assert (r.prefix_len, r.last_node) == (4, 1)
    assert states(c, "swa")[1] == "device+host"  # healed with the caller's SWA slots
    assert c.available("swa") == swa_before - 4  # adopted, not freed
    assert c.available("full") == 32 - 12  # the duplicate FULL slots were freed
    c.check()


def test_insert_below_swa_evicted_len_leaves_a_tombstone_segment():
    c, _d = swa_cache(window=4)
    full = c.alloc(8)
    swa = c.alloc(4, component="swa")
    r = c.insert(K[:8], full, swa_indices=torch.cat([torch.full((4,), -1), swa]),
                 swa_evicted_len=4)
    assert r.last_node == 2 and parents(c) == {1: 0, 2: 1}
    assert states(c, "swa") == {1: "tombstone", 2: "device+host"}  # write-through backup
    assert c.match_prefix(K[:8]).device_prefix_len == 8
    assert c.match_prefix(K[:4]).device_prefix_len == 0
    c.check()


def test_window_lock_pins_one_window_and_releases_early():
    c, d = swa_cache(window=4)
    chain(d)
    rc = c.lock(3, owner="req-1")
    assert rc.pins == (("full", (3, 2, 1)), ("swa", (3,)))
    assert c.protected[c.ci["swa"]][0] == 4 and c.protected[0][0] == 12
    rc = c.release_swa(rc)
    assert rc.swa_released and c.protected[c.ci["swa"]][0] == 0
    r = c.evict(4, component="swa")  # node 3 is FULL-locked: its SWA is tombstoned, not evicted
    assert r.tombstoned == (("swa", 1),)
    r = c.evict(8, component="swa")
    assert r.tombstoned == (("swa", 2), ("swa", 3)) and r.evicted_nodes == ()
    c.unlock(rc)
    assert c.protected[0][0] == 0
    c.check()


def mamba_cache(cap=None) -> tuple[HiRadixCache, Driver]:
    c = HiRadixCache(make_config(("full", "mamba"), device_tokens=64, host_tokens=64,
                                 mamba_slots=8, mamba_host_slots=8,
                                 mamba_max_states_per_path=cap))
    return c, Driver(c)


def test_mamba_state_belongs_to_the_node_end_and_split_parents_have_none():
    c, d = mamba_cache()
    d.insert(K[:8])
    d.insert(K[:4] + [60, 61])
    assert parents(c) == {1: 2, 2: 0, 3: 2}
    assert states(c, "mamba") == {1: "device+host", 2: "tombstone", 3: "device+host"}
    m = c.match_prefix(K[:4])  # no state at the end of node 2: no usable prefix
    assert (m.device_prefix_len, m.best_match_node) == (0, 0)
    c.poll()
    c.check()


def test_mamba_copy_on_write_gives_the_request_its_own_slot():
    c, d = mamba_cache()
    d.insert(K[:8])
    c.poll()
    mi = c.ci["mamba"]
    m = c.match_prefix(K[:8], cow_mamba=True)
    node_slot = c.node(m.last_device_node).data[mi].values[Tier.DEVICE]
    assert m.mamba_slot is not None and int(m.mamba_slot) != int(node_slot)
    pool = c.device_pools[mi]
    assert torch.equal(pool.read(m.mamba_slot), state_for(K, 8, (3,)))
    pool.write(m.mamba_slot, torch.zeros(1, 3))  # the request advances its own state
    assert torch.equal(pool.read(node_slot), state_for(K, 8, (3,)))
    assert c.request_held[mi][0] == 1
    c.free(m.mamba_slot, component="mamba")
    c.check()


def test_mamba_per_path_cap_tombstones_the_shallowest_states():
    c, d = mamba_cache(cap=2)
    for n in (2, 4, 6, 8):
        d.insert(K[:n])
        c.poll()  # an in-flight backup pins the states it copies
    assert parents(c) == {1: 0, 2: 1, 3: 2, 4: 3}
    assert states(c, "mamba") == {1: "host", 2: "host", 3: "device+host", 4: "device+host"}
    c.check()


def test_mamba_host_state_loads_back_with_cow():
    c, d = mamba_cache()
    d.insert(K[:8])
    c.poll()
    c.evict(8)
    m = c.match_prefix(K[:8])
    assert (m.host_hit_length, m.mamba_host_hit_length) == (8, 1)
    lb = c.load_back(m, cow_mamba=True)
    assert lb.loaded == (("full", 8), ("mamba", 1)) and lb.mamba_slot is not None
    c.poll()
    pool = c.device_pools[c.ci["mamba"]]
    assert torch.equal(pool.read(lb.mamba_slot), state_for(K, 8, (3,)))
    d.verify_device_prefix(K[:8], lb.anchor)
    c.free(lb.mamba_slot, component="mamba")
    c.check()
