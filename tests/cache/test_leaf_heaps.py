"""The evictable-leaf heaps: exact LRU victims, one entry per leaf, none for anything else.

A tier's ``LeafHeap`` is its leaf set and its LRU order at once (``cache/_leafheap.c``, and
``PyLeafHeap`` where that is not built). Recency never files (``touch`` only raises
``last_access``); ``pop_lru`` moves a touched entry to its node's tick when it surfaces. A node
that stops being a leaf leaves the heap at once, so eviction never meets its entry. These tests
run the cache on both versions, check every victim against a scan of the leaf set, and hold
the two versions to each other and to a model on random operations (random seeds in the long
fuzz profile).
"""

from __future__ import annotations

import os
import random
import signal

import pytest
import torch

from radixscope.cache import HiRadixCache, leaves
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.leaves import PyLeafHeap
from radixscope.cache.tiers import DEVICE, HOST
from tests.kits.cachekit import make_config

LONG = os.environ.get("RADIXSCOPE_FUZZ") == "long"
SEEDS = [random.randrange(2**32) for _ in range(100)] if LONG else list(range(12))
IMPLS = ["native", "python"]


def _impl(name: str) -> type:
    if name == "python":
        return PyLeafHeap
    if leaves.LEAF_HEAP != "native":
        pytest.skip("the native leaf heap was not built")
    return leaves.LeafHeap


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch) -> type:
    """Caches made in the test run on this leaf heap."""
    cls = _impl(request.param)
    monkeypatch.setattr(leaves, "LeafHeap", cls)
    return cls


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


def test_the_cache_runs_on_the_native_leaf_heap_when_it_is_built() -> None:
    from tests.kits.require import missing
    if leaves._built is None:
        missing("native", "the native leaf heap was not built")
    assert leaves.LEAF_HEAP == "native" and leaves._built.ABI == leaves.ABI
    c = HiRadixCache(make_config())
    assert all(type(h) is leaves._built.LeafHeap for h in c.leaves)


def test_every_victim_is_the_lru_leaf_and_the_heap_holds_only_leaves(impl) -> None:
    rng = random.Random(1234)
    c = HiRadixCache(make_config(device_tokens=512, host_tokens=0, write_policy="write_back"))
    assert type(c.d_leaves) is impl
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
        filed = c.d_leaves.items()
        # one entry per leaf, none for internal or deleted nodes: eviction meets nothing stale
        assert len(filed) == len(c.d_leaves) == len({i for i, _ in filed})
        assert all(c.tree.nodes[i].data[0].values[DEVICE] is not None
                   and c.tree.nodes[i].device_children == 0 for i, _ in filed)
    c.check()
    assert victims > 200


def test_host_heap_victims_are_lru_after_touches(impl) -> None:
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


def test_touches_file_nothing(impl) -> None:
    """Matches only raise recency: 2000 of them over the cached leaves file no entry (the
    entries keep their old ticks, at or below their nodes'), and the next victim is still the
    LRU leaf."""
    rng = random.Random(7)
    c = HiRadixCache(make_config(device_tokens=4096, host_tokens=0))
    keys = [[k, *(rng.randrange(1, 9) for _ in range(15))] for k in range(1, 120)]
    for i, k in enumerate(keys):
        _request(c, k, f"a{i}")
    before = dict(c.d_leaves.items())
    assert len(before) >= 100
    for _ in range(2000):
        c.match_prefix(rng.choice(keys))
    assert dict(c.d_leaves.items()) == before
    if impl is PyLeafHeap:
        assert len(c.d_leaves._heap) == len(before)
    want = _lru_by_scan(c, DEVICE)
    assert c.evict(1).evicted_nodes[0] == want[1]
    c.check()


def test_check_reports_a_lost_leaf_an_entry_past_its_tick_and_a_stranger(impl) -> None:
    c = HiRadixCache(make_config(device_tokens=256, host_tokens=0))
    for i in range(6):
        _request(c, [i + 1, *range(10, 20)], f"r{i}")
    c.check()
    leaf = min(c.d_leaves)
    tick = c.tree.nodes[leaf].last_access
    c.d_leaves.discard(leaf)
    with pytest.raises(InvariantViolation, match=rf"full.device_leaves.*missing \[{leaf}\]"):
        c.check()
    c.d_leaves.file(leaf, tick + 5)
    with pytest.raises(InvariantViolation, match=rf"heap tick {tick + 5} past its last access"):
        c.check()
    c.d_leaves.file(leaf, tick)
    c.check()
    c.h_leaves.file(10**6, 0)
    with pytest.raises(InvariantViolation, match="a node not in the tree has a heap entry"):
        c.check()


def test_a_leaf_eviction_skips_stays_findable(impl) -> None:
    """An L3 prefetch host-pins its anchor's path, device-only nodes included; eviction pops
    such a leaf and leaves it resident (a pinned node is never deleted). The popped leaf must
    go back: without it the leaf, still counted evictable, could never be evicted again, and an
    ``alloc`` trusting the evictable ledger ran out of memory. Found by the long fuzz profile
    (full, page 1, write_through_selective, clean L3)."""
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=0))
    _request(c, list(range(1, 33)), "a")
    _request(c, list(range(100, 132)), "b")
    leaf = c.tree.nodes[c.match_prefix(list(range(1, 33))).last_device_node]
    entry = c.acquire(leaf, HOST, {0: [leaf]}, "prefetch:p1")  # as a prefetch's anchor pin
    out = c.evict(64)
    assert leaf.id not in out.evicted_nodes and leaf.id in c.leaves[DEVICE]
    c.check()  # every evictable leaf is still filed
    c.release(c.locks[entry])
    assert c.evict(32).evicted_nodes == (leaf.id,)
    c.check()


def test_a_skipped_leaf_whose_write_back_found_no_room_does_not_stall_eviction(impl) -> None:
    """Under write_back, evicting a leaf first backs it up to host. With the host tier full and
    the leaf host-pinned (an L3 prefetch's anchor), the backup fails and releases the pins it
    took, which files the leaf again; the leaf is then skipped. It must stay out until the
    call ends: it was popped again at once, and ``evict`` never returned (also before the
    indexed heap). Found by a review."""
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=16, write_policy="write_back"))
    _request(c, list(range(1, 33)), "a")
    _request(c, list(range(100, 132)), "b")
    held = c.take_slots(0, HOST, 16)  # the host tier full, nothing on it evictable
    leaf = c.tree.nodes[c.match_prefix(list(range(1, 33))).last_device_node]
    other = c.match_prefix(list(range(100, 132))).last_device_node  # more recent than leaf
    c.acquire(leaf, HOST, {0: [leaf]}, "prefetch:p1")

    def stalled(signum, frame):
        raise TimeoutError("evict did not return in 10 s")

    old = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(10)
    try:
        out = c.evict(32)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert out.evicted_nodes == (other,) and leaf.id in c.d_leaves
    c.pool(0, HOST).alloc.free(held)  # given back, as a transfer would: the ledgers add up
    c.check()


def test_a_victim_whose_eviction_raises_stays_findable(impl, monkeypatch) -> None:
    """A victim's write-back that raises ends the eviction call; the victim, popped from the
    heap and left in the tree as it was, must be filed again (``check()`` reported it missing
    from the leaf set, and no later eviction could take it)."""
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=64, write_policy="write_back"))
    _request(c, list(range(1, 33)), "a")
    _request(c, list(range(100, 132)), "b")
    victim = _lru_by_scan(c, DEVICE)[1]

    def refuse(node, cis=None):
        raise RuntimeError("host copy failed")

    monkeypatch.setattr(c, "save_to_host", refuse)
    with pytest.raises(RuntimeError, match="host copy failed"):
        c.evict(32)
    assert victim in c.d_leaves
    c.check()
    monkeypatch.undo()
    assert c.evict(32).evicted_nodes[0] == victim
    c.check()


def test_leaves_locked_and_unlocked_in_bulk_come_out_in_lru_order(impl) -> None:
    """1,100 leaves all locked at once leave the heap at once (the heapq scheme kept their
    entries until eviction met them or a rebuild); unlocked in random order and some touched
    again, they must come out in exact LRU order, and ``check()`` hold throughout."""
    c = HiRadixCache(make_config(device_tokens=4 * 1200, host_tokens=0))
    keys = [[k // 64 + 1, k % 64 + 1, 7, 7] for k in range(1100)]
    for i, k in enumerate(keys):
        _request(c, k, f"a{i}")
    assert len(c.leaves[DEVICE]) == 1100
    receipts = [c.lock(c.match_prefix(k).last_device_node, owner=f"l{i}")
                for i, k in enumerate(keys)]
    assert not c.leaves[DEVICE] and not c.leaves[DEVICE].items()
    _request(c, [999, 1, 2, 3], "late")
    assert len(c.leaves[DEVICE]) == 1
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


class _Node:
    __slots__ = ("last_access",)

    def __init__(self, tick: int) -> None:
        self.last_access = tick


@pytest.mark.parametrize("seed", SEEDS)
def test_the_two_heaps_agree_with_a_model_on_random_operations(seed: int) -> None:
    """File, discard, touch (a node's tick raised, nothing filed) and pop, at random, over ids
    that repeat and ticks that tie: both versions pop the model's (tick, id) minimum, hold the
    same members at the same ticks, and report no broken rule."""
    heaps = [PyLeafHeap()] + ([leaves._built.LeafHeap()] if leaves._built else [])
    rng = random.Random(seed)
    nodes: dict[int, _Node] = {}
    model: dict[int, int] = {}  # id -> tick filed
    tick = 0
    for step in range(3000):
        r = rng.random()
        nid = rng.randrange(1, 400) if rng.random() < 0.9 else rng.randrange(2**64 - 4, 2**64)
        if r < 0.45:
            tick += rng.randrange(0, 2)  # ties are common: several leaves filed at one tick
            node = nodes.setdefault(nid, _Node(tick))
            node.last_access = max(node.last_access, tick)
            model[nid] = node.last_access
            for h in heaps:
                h.file(nid, node.last_access)
        elif r < 0.6:
            model.pop(nid, None)
            for h in heaps:
                h.discard(nid)
        elif r < 0.8 and model:  # a touch: only the node's tick moves
            tick += 1
            nodes[rng.choice(list(model))].last_access = tick
        else:
            want = min(((nodes[i].last_access, i) for i in model), default=None)
            got = [h.pop_lru(nodes) for h in heaps]
            if want is None:
                assert got == [None] * len(heaps), step
            else:
                assert all(n is nodes[want[1]] for n in got), (step, want)
                del model[want[1]]
        if step % 97 == 0 or step == 2999:
            for h in heaps:
                assert sorted(h) == sorted(model), step
                assert all(t <= nodes[i].last_access for i, t in h.items())
                assert h.violations() == [], step
    assert len({tuple(sorted(h.items())) for h in heaps}) == 1


@pytest.mark.parametrize("name", IMPLS)
def test_bad_input_is_refused_before_any_change(name: str) -> None:
    h = _impl(name)()
    nodes = {1: _Node(3), 2: _Node(1)}
    h.file(1, 3)
    h.file(2, 1)
    for args, err, msg in ((("x", 1), TypeError, "node id must be an int, got 'x'"),
                           ((True, 1), TypeError, "node id must be an int, got True"),
                           ((-1, 1), ValueError, r"node id -1 is out of range"),
                           ((1, 2**64), ValueError, r"tick 18446744073709551616 is out of range"),
                           ((1, 2.0), TypeError, "tick must be an int, got 2.0")):
        with pytest.raises(err, match=msg):
            h.file(*args)
    with pytest.raises(TypeError, match="node id must be an int, got None"):
        h.discard(None)
    with pytest.raises(TypeError, match="nodes must be the tree's dict"):
        h.pop_lru([nodes[1], nodes[2]])
    assert sorted(h.items()) == [(1, 3), (2, 1)] and h.violations() == []
    assert "x" not in h and -1 not in h and 2**70 not in h and 1 in h
    with pytest.raises(RuntimeError, match="holds node 2, which is not in the tree"):
        h.pop_lru({1: nodes[1]})
    assert sorted(h.items()) == [(1, 3), (2, 1)]
    assert h.pop_lru(nodes) is nodes[2] and h.pop_lru(nodes) is nodes[1]
    assert h.pop_lru(nodes) is None and len(h) == 0 and not h


@pytest.mark.parametrize("name", IMPLS)
def test_a_pop_whose_node_read_changes_the_heap_starts_again(name: str) -> None:
    """Reading a node's ``last_access`` can run code (a property) that files or discards:
    ``pop_lru`` must start again from the new top, not take out an entry that is no longer
    there (the first C version ran on with an empty heap and wrote before its array)."""
    h = _impl(name)()

    class Discards:
        @property
        def last_access(self) -> int:
            h.discard(1)
            return 5

    h.file(1, 5)
    assert h.pop_lru({1: Discards()}) is None
    assert len(h) == 0 and h.items() == [] and h.violations() == []
    h.file(2, 9)
    assert h.items() == [(2, 9)] and h.violations() == []

    class FilesAnother:
        @property
        def last_access(self) -> int:
            h.file(3, 1)  # a new, older top
            return 9

    nodes = {2: FilesAnother(), 3: _Node(1)}
    assert h.pop_lru(nodes) is nodes[3]
    assert h.items() == [(2, 9)] and h.violations() == []
    with pytest.raises(RuntimeError, match="holds node 2, which is not in the tree"):
        h.pop_lru({2: None})
