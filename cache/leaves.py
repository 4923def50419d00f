"""FULL's evictable leaves: per tier, one ``LeafHeap``, the set of leaf ids eviction may take
and their LRU order at once, so eviction pops the least recently used leaf without a scan.

A ``LeafHeap`` holds exactly one entry, ``(tick, id)``, per leaf and an index from id to
entry (``cache/_leafheap.c``, C where built; ``PyLeafHeap`` below otherwise, held to the same
victims by tests/cache/test_leaf_heaps.py):

- ``file(id, tick)`` puts a leaf in (or moves it to ``tick``); ``discard(id)`` takes it out at
  once, so eviction never meets entries of nodes that became internal or left the tree;
- ``pop_lru(nodes)`` takes out the least recently used leaf and returns its node. Recency never
  files: ``touch`` only raises ``last_access``, so an entry's tick is at most its node's, and an
  entry whose node was touched since is moved to the node's tick when it surfaces. The node
  returned is exact LRU, since every other leaf's entry is at or below its true tick;
- ``len``, ``in`` and iteration over ids as a set's; ``items()`` and ``violations()`` for
  ``check()``.

A mixin of ``CacheCore``: its primitives (``set_value``, ``acquire``, ``release``, ``split``,
``delete``) call ``refresh_leaf`` after every change that can make or unmake a leaf; eviction
calls ``pop_leaf`` and files a leaf it popped but did not evict again with ``refresh_leaf``.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from radixscope.cache.native import load_built
from radixscope.cache.tiers import DEVICE, HOST, TIERS

if TYPE_CHECKING:
    from radixscope.cache.tree import Node, RadixTree

ABI = 1  # _leafheap.c's LEAFHEAP_ABI: a build with another number is stale
_SHIFT = 64
_ID = (1 << _SHIFT) - 1


def _u64(value: object, what: str) -> int:
    """``value`` as an id or a tick (an int in 0 .. 2**64-1), with ``_leafheap.c``'s errors."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if not 0 <= value <= _ID:
        raise ValueError(f"{what} {value!r} is out of range (0 .. 2**64-1)")
    return value


class PyLeafHeap:
    """A tier's evictable leaves in LRU order, in Python (the reference ``_leafheap.c`` is held
    to): a dict of id -> tick for membership and a ``heapq`` of ``tick << 64 | id`` ints for
    order, where an entry whose tick is no longer its id's (discarded, or filed again) is dropped
    when it surfaces and the heap is rebuilt when such entries outnumber the live ones."""

    __slots__ = ("_ticks", "_heap")

    def __init__(self) -> None:
        self._ticks: dict[int, int] = {}
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self._ticks)

    def __contains__(self, nid: object) -> bool:
        return isinstance(nid, int) and not isinstance(nid, bool) and nid in self._ticks

    def __iter__(self):
        return iter(list(self._ticks))

    def __repr__(self) -> str:
        return f"LeafHeap({len(self._ticks)} leaves)"

    def file(self, nid: int, tick: int, /) -> None:
        _u64(nid, "node id")
        _u64(tick, "tick")
        if self._ticks.get(nid) == tick:
            return
        self._ticks[nid] = tick
        heapq.heappush(self._heap, tick << _SHIFT | nid)
        if len(self._heap) > 2 * len(self._ticks) + 1024:
            self._rebuild()

    def discard(self, nid: int, /) -> None:
        _u64(nid, "node id")
        self._ticks.pop(nid, None)

    def pop_lru(self, nodes: dict, /) -> Node | None:
        if not isinstance(nodes, dict):
            raise TypeError(f"pop_lru: nodes must be the tree's dict of id -> node, got {nodes!r}")
        heap, ticks = self._heap, self._ticks
        while heap:
            entry = heap[0]
            nid, tick = entry & _ID, entry >> _SHIFT
            if ticks.get(nid) != tick:  # discarded or filed again since
                heapq.heappop(heap)
                continue
            node = nodes.get(nid)
            if node is None:
                raise RuntimeError(f"the evictable-leaf heap holds node {nid}, which is not in "
                                   "the tree")
            now = _u64(node.last_access, "last_access")
            if not heap or heap[0] != entry or ticks.get(nid) != tick:
                continue  # reading it ran code that changed the heap: start again
            if now != tick:  # touched since it was filed: re-filed at its tick now
                ticks[nid] = now
                heapq.heapreplace(heap, now << _SHIFT | nid)
                continue
            heapq.heappop(heap)
            del ticks[nid]
            return node
        return None

    def items(self) -> list[tuple[int, int]]:
        return list(self._ticks.items())

    def violations(self) -> list[str]:
        """Every id's tick has an entry in the heap, which is in heap order."""
        filed = {e for e in self._heap if self._ticks.get(e & _ID) == e >> _SHIFT}
        out = [f"node {nid}: no heap entry at its tick {tick}" for nid, tick in self._ticks.items()
               if tick << _SHIFT | nid not in filed]
        heap = self._heap
        out += [f"entry {p} sorts before its parent entry (heap order)"
                for p in range(1, len(heap)) if heap[p] < heap[(p - 1) // 2]]
        return out

    def _rebuild(self) -> None:
        self._heap[:] = [t << _SHIFT | i for i, t in self._ticks.items()]
        heapq.heapify(self._heap)


_built = load_built("radixscope.cache._leafheap", ABI, "_leafheap.c", "the Python leaf heap")
LEAF_HEAP = "python" if _built is None else "native"
LeafHeap: type = PyLeafHeap if _built is None else _built.LeafHeap


def pinned(node: Node) -> bool:
    """Whether any component holds a pin (lock ref or host ref) on ``node`` on any tier."""
    for d in node.data:
        for r in d.refs:
            if r:
                return True
    return False


class LeafSets:
    """The evictable-leaf heaps of FULL, per tier."""

    tree: RadixTree

    def _init_leaves(self) -> None:
        self.leaves = [LeafHeap() for _ in TIERS]
        self.d_leaves = self.leaves[DEVICE]
        self.h_leaves = self.leaves[HOST]

    def refresh_leaf(self, node: Node) -> None:
        """Re-file ``node`` in the device / host evictable-leaf heaps after a change.

        D-leaf: FULL on device, unpinned, no child with FULL on device (FULL's lock_ref bounds
        every auxiliary lock_ref, so it alone decides). H-leaf: FULL host-only, childless, no
        pin or host ref on any component."""
        if node.parent is None:
            return
        f = node.data[0]
        nid = node.id
        if f.values[DEVICE] is not None:
            self.h_leaves.discard(nid)
            if f.refs[DEVICE] == 0 and node.device_children == 0:
                self.d_leaves.file(nid, node.last_access)
            else:
                self.d_leaves.discard(nid)
            return
        self.d_leaves.discard(nid)
        if (f.values[HOST] is not None and not node.children
                and not pinned(node)):
            self.h_leaves.file(nid, node.last_access)
        else:
            self.h_leaves.discard(nid)

    def pop_leaf(self, tier: int) -> Node | None:
        """Take out the least recently used evictable leaf of a tier and return it, or None.
        O(log n) and exact (see the module's docstring); a leaf popped but not evicted goes
        back with ``refresh_leaf``."""
        return self.leaves[tier].pop_lru(self.tree.nodes)

    def leaf_heap_violations(self, name: str) -> list[tuple]:
        """What ``check()`` reports about the heaps (``name``: FULL's) besides their membership
        (which ``check()`` compares with a scan): the structure's own rules, and every entry's
        tick at or below its node's last access (else it would be evicted out of LRU order)."""
        out = []
        nodes = self.tree.nodes
        for tier, heap in enumerate(self.leaves):
            rule = f"{name}.{TIERS[tier].label}_leaf_heap"
            out += [(rule, None, msg) for msg in heap.violations()]
            for nid, tick in heap.items():
                node = nodes.get(nid)
                if node is None:
                    out.append((rule, nid, "a node not in the tree has a heap entry"))
                elif tick > node.last_access:
                    out.append((rule, nid, f"heap tick {tick} past its last access "
                                           f"{node.last_access}: evicted out of LRU order"))
        return out


__all__ = ["LEAF_HEAP", "LeafHeap", "LeafSets", "PyLeafHeap", "pinned"]
