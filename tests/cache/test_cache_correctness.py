"""Regression tests for issue 12 items 1-5: a load-back in flight is never read unlanded, poll ids
are validated before any ack, insert and free never take or give back slots the tree owns, and
handles from another cache are refused. Each fails on the code before its fix."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config, state_for

KEY = [1, 2, 3, 4, 5, 6, 7, 8]


def _loading(components):
    """A cache whose KEY is host-only, device buffers scrubbed, with a load-back in flight."""
    c = HiRadixCache(make_config(components, device_tokens=32, host_tokens=64, sliding_window=4))
    d = Driver(c)
    d.insert(KEY)
    c.poll()
    for comp in reversed(components):
        c.evict(10**6, component=comp)
    for pool in c.device_pools:
        pool.buf.fill_(-7.0)  # what an unlanded slot holds
    m = c.match_prefix(KEY)
    assert m.needs_load_back and m.device_prefix_len == 0
    lb = c.load_back(m)
    assert lb.transfer_id is not None
    return c, d, lb


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_match_during_load_back_returns_only_readable_slots(components):
    c, d, lb = _loading(components)
    m = c.match_prefix(KEY)  # a second request sharing the prefix, before the poll
    assert m.device_prefix_len == 8 and m.last_device_node == lb.anchor
    got = c.device_pools[0].read(m.device_indices)
    assert not bool((got == -7.0).any()), "match returned slots whose load-back has not landed"
    d.verify_device_prefix(KEY, m.last_device_node)
    assert c.poll() == [lb.transfer_id]  # the ack still comes from poll
    d.verify_device_prefix(KEY, m.last_device_node)
    c.check()


@pytest.mark.parametrize("components", [("full", "mamba"), ("full", "swa", "mamba")],
                         ids=["full+mamba", "full+swa+mamba"])
def test_cow_mamba_during_load_back_never_copies_an_unloaded_state(components):
    c, _d, lb = _loading(components)
    m = c.match_prefix(KEY, cow_mamba=True)
    assert m.mamba_slot is not None
    pool = c.device_pools[c.ci["mamba"]]
    want = state_for(KEY, 8, pool.buf.shape[1:])
    assert torch.equal(pool.read(m.mamba_slot), want)
    c.poll([lb.transfer_id])
    assert torch.equal(pool.read(m.mamba_slot), want)  # stayed wrong after poll before the fix
    c.free(m.mamba_slot, component="mamba")
    c.check()


def test_load_back_cow_from_a_state_still_loading_copies_the_loaded_state():
    c, _d, lb = _loading(("full", "mamba"))
    m = c.match_prefix(KEY)  # no load-back needed any more: the CoW copies the device state
    lb2 = c.load_back(m, cow_mamba=True)
    pool = c.device_pools[c.ci["mamba"]]
    c.poll([lb.transfer_id])
    assert torch.equal(pool.read(lb2.mamba_slot), state_for(KEY, 8, pool.buf.shape[1:]))
    c.check()


def _with_backup():
    c = HiRadixCache(make_config(("full",), device_tokens=32, host_tokens=64))
    r = Driver(c).insert([1, 2, 3, 4])
    (t,) = r.backups
    return c, t


@pytest.mark.parametrize("ids,needle", [
    ("dup", "appears more than once"), ("unknown", "transfer 99 is not in flight"),
    ("acked", "already acked")])
def test_poll_of_duplicate_unknown_or_acked_ids_is_rejected_before_any_ack(ids, needle):
    c, t = _with_backup()
    if ids == "acked":
        c.poll([t])
    arg = {"dup": [t, t], "unknown": [99], "acked": [t]}[ids]
    before = c.snapshot()
    with pytest.raises(ValueError, match=needle):
        c.poll(arg)
    assert c.snapshot() == before
    c.check()
    if ids != "acked":
        assert c.poll([t]) == [t]  # still ackable: its pins go
    assert not c.locks


def test_check_flags_pins_held_for_a_transfer_that_can_no_longer_be_acked():
    c, t = _with_backup()
    del c.engine.pending[t]  # what the old poll([t, t]) left behind
    names = {name for name, _n, _d in c.violations()}
    assert {"transfer.unackable", "transfer.stranded_pin"} <= names


def test_check_flags_a_free_count_that_left_the_free_stack():
    """A pool's ``available`` is a plain attribute kept beside its free stack's top (a read on
    every alloc, free and pool record): ``check()`` holds the two together."""
    c, _ = _with_backup()
    assert c.violations() == []
    alloc = c.device_pools[0].alloc
    alloc.available += 1
    assert [(n, d) for n, _i, d in c.violations() if n == "full.device.available"] == [
        ("full.device.available", f"available {alloc.available} != {alloc._top} free pages x "
         f"page size {alloc.page_size}")]


def _cache():
    c = HiRadixCache(make_config(("full",), device_tokens=32, host_tokens=64))
    r = Driver(c).insert([1, 2, 3, 4])
    c.poll()
    return c, r


@pytest.mark.parametrize("case,needle", [
    ("same slot twice", "appear more than once"),
    ("slots another node owns", "owned by the tree"),
    ("prev_prefix_len beyond the tree", "holds only 4 tokens"),
    ("tree prefix without prev_prefix_len", "owned by the tree"),
])
def test_insert_rejects_slots_it_must_not_adopt_or_free(case, needle):
    c, r = _cache()
    tree_slots = c.node(r.last_node).data[0].values[Tier.DEVICE].clone()
    new = c.alloc(2)
    call = {
        "same slot twice": lambda: c.insert([9, 9], torch.cat([new[:1], new[:1]])),
        "slots another node owns": lambda: c.insert([7, 7, 7, 7], tree_slots),
        "prev_prefix_len beyond the tree": lambda: c.insert(
            [1, 2, 3, 4, 5, 6], torch.cat([tree_slots, new]), prev_prefix_len=6),
        "tree prefix without prev_prefix_len": lambda: c.insert(
            [1, 2, 3, 4, 5, 6], torch.cat([tree_slots, new])),
    }[case]
    before = c.snapshot()
    with pytest.raises(ValueError, match=needle):
        call()
    assert c.snapshot() == before
    c.check()
    # the legitimate call still works
    res = c.insert([1, 2, 3, 4, 5, 6], torch.cat([tree_slots, new]), prev_prefix_len=4)
    assert res.prefix_len == 4 and res.new_tokens == 2
    c.check()


def test_free_of_slots_the_tree_owns_is_rejected():
    c, r = _cache()
    slots = c.node(r.last_node).data[0].values[Tier.DEVICE].clone()
    before = c.snapshot()
    with pytest.raises(ValueError, match=r"slots \[\d+.*owned by the tree"):
        c.free(slots)
    assert c.snapshot() == before
    c.check()
    assert not set(c.alloc(c.available()).tolist()) & set(slots.tolist())


def test_handles_from_another_cache_are_refused():
    a, _ = _cache()
    b, _ = _cache()
    Driver(a).insert([1, 2, 3, 4, 5, 6, 7, 8])
    a.poll()
    a.evict(10**6)
    m = a.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    assert m.needs_load_back
    lb = a.load_back(m)
    before = b.snapshot()
    for call in (lambda: b.load_back(m), lambda: b.admission(m, 4),
                 lambda: b.poll([lb.transfer_id])):
        with pytest.raises(ValueError, match="another cache instance"):
            call()
    assert b.snapshot() == before
    b.check()
    assert lb.cache_instance == a.instance and m.cache_instance == a.instance
    assert a.poll([lb.transfer_id]) == [lb.transfer_id]
    a.check()


@pytest.mark.parametrize("prev", [0, 4, 8, 12], ids=["none", "inside A", "end of A", "inside B"])
def test_insert_resumes_where_its_guard_walk_stopped(prev):
    """``insert``'s guard walks the key below ``prev_prefix_len`` once and the insert resumes
    there (issue 17). Tree: A = [1..8] (node 1) -> B = [9..16] (node 2). Inserting
    [1..16, 17, 18] with the tree's slots below ``prev`` and fresh request slots from ``prev``
    on: the fresh slots for positions already cached (prev..15) go back to the pool, the two
    new tokens become leaf 3 under B, and no node is split, whatever ``prev`` is."""
    c = HiRadixCache(make_config(("full",), device_tokens=64))
    d = Driver(c)
    d.insert(list(range(1, 9)))
    d.insert(list(range(1, 17)))
    assert {n: len(x.key) for n, x in c.tree.nodes.items() if n} == {1: 8, 2: 8}
    m = c.match_prefix(list(range(1, 17)))
    tree_slots = m.device_indices
    fresh = c.alloc(18 - prev)
    free_before = c.available()
    key = list(range(1, 19))
    r = c.insert(key, torch.cat([tree_slots[:prev], fresh]), prev_prefix_len=prev)
    assert (r.prefix_len, r.new_tokens, r.last_node) == (16, 2, 3)
    assert {n: len(x.key) for n, x in c.tree.nodes.items() if n} == {1: 8, 2: 8, 3: 2}
    assert c.tree.nodes[3].parent.id == 2
    assert c.available() == free_before + (16 - prev)  # the duplicates freed, nothing else
    assert torch.equal(c.tree.nodes[3].data[0].values[Tier.DEVICE], fresh[16 - prev:])
    assert torch.equal(c.match_prefix(key).device_indices[:16], tree_slots)
    c.check()


@pytest.mark.parametrize("retaken", [False, True])
def test_check_flags_a_transfer_whose_slots_were_freed_or_freed_and_taken_again(retaken):
    """A backup still writes its host slots; a faulty eviction frees them under it (SGLang
    issue #19126). ``check()`` reports the free slots, and, once another node has taken them
    again (no slot is free any more, so a look at the allocator alone finds nothing), that
    node."""
    c, t = _with_backup()
    node = c.node(c.transfers[t].anchor)
    dst = node.data[0].values[Tier.HOST]
    assert c.violations() == []
    c.set_value(node, 0, Tier.HOST, None)  # what the faulty eviction does, host refs ignored
    c.free_slots(0, Tier.HOST, dst)
    freed = {(n, d) for n, _i, d in c.violations() if n == "transfer.slot_freed"}
    assert freed == {("transfer.slot_freed", f"backup {t} still writes full/host slots "
                      f"{sorted(dst.tolist())[:8]}, which are free")}
    if retaken:
        r = Driver(c).insert([9, 8, 7, 6])  # its backup takes the freed host slots again
        other = c.node(r.last_node)
        assert sorted(other.data[0].values[Tier.HOST].tolist()) == sorted(dst.tolist())
        details = [d for n, _i, d in c.violations() if n == "transfer.slot_freed"]
        assert details == [f"backup {t} still writes full/host slots {sorted(dst.tolist())[:8]}, "
                           f"freed and taken again by node(s) [{other.id}]"]
