"""Regressions for bugs a code review found (each failed before its fix): write-back paths that
made room by reclaiming the very nodes being loaded or backed up, a write-back leaf with
host-only children, and a load-back that changed the tree before running out of memory."""

from __future__ import annotations

import torch

from radixscope.cache import CacheOutOfMemory, HiRadixCache
from tests.kits.cachekit import Driver, make_config, parents, states

K = list(range(1, 13))


def test_write_back_load_back_must_not_evict_its_own_host_only_anchor():
    """load_back allocates device slots (evicting) before host-pinning the nodes it will load.
    Under write_back the eviction backs the victim up synchronously, and finding host room for
    that backup evicts the LRU host-only leaf -- which is the load-back's own anchor."""
    c = HiRadixCache(make_config(("full",), device_tokens=4, host_tokens=4,
                                 write_policy="write_back"))
    d = Driver(c)
    d.insert(K[:4])
    c.evict(4)                                 # A = K[:4] backed up and demoted to host-only
    assert states(c) == {1: "host"}
    d.insert([50, 51, 52, 53])                 # B fills the device pool, not backed up
    m = c.match_prefix(K[:4])
    assert (m.best_match_node, m.host_hit_length) == (1, 4)
    adm = c.admission(m, 0)
    assert adm.fits
    lb = c.load_back(m)                        # must evict B (backing it up) and load A
    c.poll()
    assert lb.device_prefix_len == 4
    d.verify_device_prefix(K[:4], lb.anchor)
    c.check()


def test_write_back_eviction_whose_backup_fails_deletes_a_node_with_host_only_children():
    """Under write_back a device leaf (no device children) may still have host-only children
    (their own backups succeeded). When its synchronous backup fails (here: no MAMBA host slot),
    evict_leaf falls through to core.delete() on a node that still has children."""
    c = HiRadixCache(make_config(("full", "mamba"), device_tokens=16, host_tokens=32,
                                 write_policy="write_back", mamba_host_slots=0))
    d = Driver(c)
    d.insert(K[:4])                             # P = K[:4], with a MAMBA state
    m = c.match_prefix(K[:8])
    lock = c.lock(m.last_device_node)
    new = c.alloc(4)
    c.insert(K[:8], torch.cat([m.device_indices, new]), prev_prefix_len=4)  # C: no state
    c.unlock(lock)
    assert parents(c) == {1: 0, 2: 1}
    c.evict(4)                                  # C: FULL-only backup succeeds -> host-only
    assert states(c) == {1: "device", 2: "host"}
    c.check()
    c.evict(4)                                  # P: backup needs a MAMBA host slot -> fails
    c.check()


def test_load_back_out_of_memory_changes_nothing():
    """load_back documents 'Raises CacheOutOfMemory with nothing changed', but it cuts the node
    straddling the SWA window (a split: new node id, journal records) before it checks room."""
    c = HiRadixCache(make_config(("full", "swa"), device_tokens=32, host_tokens=64,
                                 sliding_window=6, swa_device_tokens=32))
    d = Driver(c)
    for n in (4, 8, 12):
        d.insert(K[:n])
    c.poll()
    c.evict(100)                                # all three nodes host-only
    assert parents(c) == {1: 0, 2: 1, 3: 2}
    held = c.alloc(24)                          # request-private: 8 free, nothing evictable
    m = c.match_prefix(K)
    assert m.host_hit_length == 12 and not c.admission(m, 0).fits
    before = c.snapshot()
    try:
        c.load_back(m)
    except CacheOutOfMemory:
        pass
    else:
        raise AssertionError("expected CacheOutOfMemory")
    assert parents(c) == {1: 0, 2: 1, 3: 2}     # node 2 was split at the window boundary
    assert c.snapshot() == before
    c.free(held)
    c.check()


def test_write_back_backup_host_room_eviction_must_not_delete_the_node_being_backed_up():
    """backup() makes host room with evict_host before pinning anything. Deleting a host-only
    leaf cascades to its 'useless' childless ancestors -- which can be the very node being backed
    up (SWA tombstoned, its only child the evicted host-only leaf). backup then sets a host value
    on, and pins, a node that is no longer in the tree."""
    c = HiRadixCache(make_config(("full", "swa"), device_tokens=32, host_tokens=4,
                                 sliding_window=4, write_policy="write_back"))
    d = Driver(c)
    d.insert(K[:4])                             # N
    d.insert(K[:8])                             # H under N
    assert parents(c) == {1: 0, 2: 1}
    r = c.evict(4, component="swa")             # N is internal and colder: SWA tombstoned
    assert r.tombstoned == (("swa", 1),)
    c.evict(4)                                  # H backed up (fills the host) and demoted
    assert states(c) == {1: "device", 2: "host"}
    c.check()
    c.evict(4)                                  # N: its backup needs host room -> evicts H
    c.check()
