"""One regression test per seed bug class from DESIGN.md ("Known bug classes")."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixscope.cache import CacheOutOfMemory, HiRadixCache, StaleHandle
from tests.kits.cachekit import Driver, make_config, parents, seed_001_tree, states

K = list(range(1, 17))


def test_seed_bug_1_load_back_anchors_on_best_match_node():
    """A host-only SWA tombstone lies between last_host_node and the match end: node 3 holds
    FULL on host but no SWA on either tier. The buggy behaviour anchors the L2 load-back on the
    deepest FULL-host node (node 3); that trips the assertion on ``m.best_match_node == 2`` and
    ``lb.anchor == 2``, and loading node 3 would leave a device node whose SWA window can never
    validate. A load-back asked to anchor there is refused (StaleHandle).

    The first insert (12 tokens, window 4) is capped: node 1 holds tokens [0, 8) FULL-only (an
    SWA tombstone) and node 2 the last window [8, 12) with SWA."""
    c = HiRadixCache(make_config(("full", "swa"), device_tokens=32, host_tokens=64,
                                 sliding_window=4, swa_device_tokens=32))
    d = Driver(c)
    d.insert(K[:12])  # node 1 (FULL only) -> node 2 (the last window, with SWA)
    assert parents(c) == {1: 0, 2: 1}
    assert states(c, "swa") == {1: "tombstone", 2: "device+host"}
    full = c.alloc(4)
    c.insert(K[:16], torch.cat([c.path_indices(2), full]),
             swa_indices=torch.full((16,), -1, dtype=torch.int64), prev_prefix_len=12,
             swa_evicted_len=16)  # node 3: the caller had no live SWA there
    c.poll()
    c.evict(100)
    assert states(c, "full") == {1: "host", 2: "host", 3: "host"}
    assert states(c, "swa") == {1: "tombstone", 2: "host", 3: "tombstone"}
    m = c.match_prefix(K[:16])
    assert m.matched_len == 16  # FULL alone would reach the end
    assert (m.best_match_node, m.last_host_node) == (2, 2)
    assert (m.host_hit_length, m.swa_host_hit_length) == (12, 4)
    with pytest.raises(StaleHandle, match="not accepted by component"):
        c.load_back(dataclasses.replace(m, best_match_node=3))
    lb = c.load_back(m)
    assert lb.anchor == 2 and lb.loaded == (("full", 12), ("swa", 4))
    c.poll()
    assert states(c, "full")[3] == "host"
    assert c.match_prefix(K[:16]).device_prefix_len == 12
    d.verify_device_prefix(K[:12], 2)
    c.check()


@pytest.mark.parametrize("hold", ["nothing", "lock", "host_ref"])
def test_seed_bug_2_tombstone_deletion_stops_at_referenced_parent(hold):
    """Deleting an unbacked leaf removes childless tombstone ancestors (here node 2 has no
    MAMBA state, so it can never be a match end) - but never one that a lock or an in-flight
    transfer still references. The buggy behaviour deletes node 2 anyway; that trips the
    ``deleted`` assertion, and ``check()`` then reports the lock table / transfer pinning a
    deleted node (``lock.dead_pin``)."""
    c, _ = seed_001_tree()
    receipt = None
    if hold == "lock":
        receipt = c.lock(2, owner="req-9")
    elif hold == "host_ref":
        assert c.backup(2) == 1  # in flight: node 2 is host-referenced until acked
    r = c.evict(8)
    if hold == "nothing":
        assert r.deleted == (1, 3, 2) and parents(c) == {}
    else:
        assert r.deleted == (1, 3) and parents(c) == {2: 0}
    c.check()
    if receipt is not None:
        c.unlock(receipt)
    c.poll()
    c.check()


def test_seed_bug_3_admission_counts_swa_load_back_pages():
    """The request's SWA window (4 tokens) is host-only, so load-back allocates 4 SWA device
    slots before prefill allocates its chunk. An admission that forgets them passes (6 <= 8)
    and the prefill then runs out of memory right after admission; ours refuses. The buggy
    behaviour trips ``assert not adm.fits`` and the final allocation raises."""
    c = HiRadixCache(make_config(("full", "swa"), device_tokens=64, host_tokens=64,
                                 sliding_window=4, swa_device_tokens=8, swa_host_tokens=64))
    d = Driver(c)
    d.insert(K[:8])
    c.poll()
    c.evict(100)
    m = c.match_prefix(K[:8] + [70] * 6)
    assert (m.host_hit_length, m.swa_host_hit_length) == (8, 4)
    adm = c.admission(m, extend_len=6)
    swa = adm.component("swa")
    assert (swa.load_back, swa.prefill, swa.headroom) == (4, 6, 8)
    assert not adm.fits and "swa: needs 10 tokens" in adm.reason
    assert swa.prefill <= swa.headroom  # what a budget without the load-back pages sees
    lb = c.load_back(m)
    c.poll()
    receipt = c.lock(lb.anchor, owner="req-3")  # the request pins its prefix, then prefills
    with pytest.raises(CacheOutOfMemory, match="requested 6, available 4"):
        c.alloc(6, component="swa")
    c.unlock(receipt)
    c.check()


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t is not None and t.numel()}


def test_seed_bug_4_no_transfer_or_caller_tensor_shares_storage_with_the_tree():
    """Seed bug class 4: a transfer descriptor shared with tree nodes and mutated in place
    (indices moved to another device) corrupted later frees. No tensor a transfer holds, and no
    tensor the caller handed to insert, may share storage (views included) with a node's value:
    the caller scribbling over its own index buffers, and over every transfer's, must leave the
    tree's slots, ``check()`` and the loaded content unchanged."""
    c = HiRadixCache(make_config(("full", "swa", "mamba"), device_tokens=32, host_tokens=64))
    d = Driver(c)
    d.insert([1, 2, 3, 4, 5, 6])
    c.poll()
    c.evict(10**6)
    idx, swa = c.alloc(4), c.alloc(4, component="swa")
    c.insert([8, 8, 8, 8], idx, swa_indices=swa)
    lb = c.load_back(c.match_prefix([1, 2, 3, 4, 5, 6]))
    node_vals = [v for n in c.tree.nodes.values() for dd in n.data for v in dd.values]
    held = [t for tr in c.transfers.values() for cp in tr.copies for t in (cp.src, cp.dst)]
    assert c.transfers and not _storages(node_vals) & _storages(held + [idx, swa,
                                                                         lb.device_indices])
    c.poll()
    snap = c.snapshot()
    idx.fill_(0)
    swa.fill_(0)
    lb.device_indices.fill_(0)
    for t in held:
        t.fill_(0)  # a mover rewriting a finished transfer's indices in place
    c.check()
    assert c.snapshot().nodes == snap.nodes
    d.verify_device_prefix([1, 2, 3, 4, 5, 6], c.match_prefix([1, 2, 3, 4, 5, 6]).last_device_node)


def test_admission_never_counts_ancestors_of_an_in_flight_backup_as_evictable():
    """Seed bug class 3's promise (admission passed => no OOM) also needs every counted
    evictable slot to be reachable by eviction. An in-flight backup of a child that pinned only
    the child left its parent counted evictable though no leaf eviction can reach it: admission
    said fits, alloc then failed. Backups now pin the FULL path to the root, and ``check()``
    flags any pin under an unpinned parent (``full.lock_path_closed``)."""
    c = HiRadixCache(make_config(("full",), device_tokens=64, host_tokens=128))
    a = list(range(100, 132))
    c.insert(a, c.alloc(32))
    c.poll()
    c.insert(a + list(range(200, 216)), c.alloc(48)[:48])  # the child's backup is in flight
    m = c.match_prefix(list(range(300, 340)))
    adm = c.admission(m, 40)
    full = adm.component("full")
    assert (full.available, full.evictable, full.protected) == (16, 0, 48)
    assert not adm.fits
    with pytest.raises(CacheOutOfMemory):
        c.alloc(40)
    c.check()
    c.poll()
    adm = c.admission(m, 40)
    assert adm.fits and adm.component("full").evictable == 48
    assert c.alloc(40).numel() == 40
    c.check()
