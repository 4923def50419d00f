"""FULL's evictable leaves: per tier, the set of leaf ids eviction may take and a lazy LRU heap
of (access tick, id) over them, so eviction pops the least recently used leaf without a scan.
An entry is one int, ``tick << 64 | id`` (ids are a counter: they stay below 2**64), so the
heap compares ints, not tuples: a pop costs half as much.

A mixin of ``CacheCore``: its primitives (``set_value``, ``acquire``, ``release``, ``split``,
``delete``) call ``refresh_leaf`` after every change that can make or unmake a leaf; eviction
calls ``pop_leaf``. A node has at most one entry per heap (``Node.in_heap``, a bit per tier),
pushed when it enters the set without one. Recency never pushes: ``touch`` only raises a node's
``last_access``, so an entry's tick is at most its node's. ``pop_leaf`` re-files an entry
whose node was touched since (at its current tick) and drops one whose node left the set or
the tree; the entry it returns is exact LRU, since every other leaf's entry is at or below its
true tick. The heap stays about as large as the sets (no per-touch growth); ``_compact_heaps``
rebuilds one only if entries of deleted nodes pile up.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from radixscope.cache.tiers import DEVICE, HOST, TIERS

if TYPE_CHECKING:
    from radixscope.cache.tree import Node, RadixTree

_SHIFT = 64
_ID = (1 << _SHIFT) - 1


def heap_entry(tick: int, node_id: int) -> int:
    """A heap entry: ordered by tick, then by id."""
    return tick << _SHIFT | node_id


def entry_id(entry: int) -> int:
    return entry & _ID


def pinned(node: Node) -> bool:
    """Whether any component holds a pin (lock ref or host ref) on ``node`` on any tier."""
    for d in node.data:
        for r in d.refs:
            if r:
                return True
    return False


class LeafSets:
    """The evictable-leaf sets and heaps of FULL, per tier."""

    tree: RadixTree

    def _init_leaves(self) -> None:
        self.leaves: list[set[int]] = [set() for _ in TIERS]
        self._heaps: list[list[int]] = [[] for _ in TIERS]
        self.d_leaves = self.leaves[DEVICE]
        self.h_leaves = self.leaves[HOST]
        self._d_heap = self._heaps[DEVICE]
        self._h_heap = self._heaps[HOST]

    def refresh_leaf(self, node: Node) -> None:
        """Re-file ``node`` in the device / host evictable-leaf sets after a change.

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
                if nid not in self.d_leaves:
                    self.d_leaves.add(nid)
                    self._file(node, DEVICE)
            else:
                self.d_leaves.discard(nid)
            return
        self.d_leaves.discard(nid)
        if (f.values[HOST] is not None and not node.children
                and not pinned(node)):
            if nid not in self.h_leaves:
                self.h_leaves.add(nid)
                self._file(node, HOST)
        else:
            self.h_leaves.discard(nid)

    def _file(self, node: Node, tier: int) -> None:
        """Push ``node``'s entry on its tier's heap unless the heap already holds one."""
        bit = 1 << tier
        if node.in_heap & bit:
            return
        node.in_heap |= bit
        heap = self._heaps[tier]
        heapq.heappush(heap, node.last_access << _SHIFT | node.id)
        if len(heap) > 4 * len(self.leaves[tier]) + 1024:
            self._compact_heaps()

    def pop_leaf(self, tier: int) -> Node | None:
        """The least recently used evictable leaf of a tier, or None. O(log n) amortised: an
        entry is re-filed at most once per touch of its node."""
        heap, live = self._heaps[tier], self.leaves[tier]
        bit = 1 << tier
        nodes = self.tree.nodes
        while heap:
            entry = heap[0]
            nid = entry & _ID
            node = nodes.get(nid)
            if node is None:
                heapq.heappop(heap)  # deleted (ids are never reused)
                continue
            if nid not in live:
                heapq.heappop(heap)
                node.in_heap &= ~bit  # it is filed again when it re-enters the set
                continue
            if node.last_access != entry >> _SHIFT:  # touched since: re-filed at its tick now
                heapq.heapreplace(heap, node.last_access << _SHIFT | nid)
                continue
            heapq.heappop(heap)
            node.in_heap &= ~bit
            return node
        return None

    def leaf_heap_violations(self, name: str) -> list[tuple]:
        """What ``check()`` reports about the heaps (``name``: FULL's): every leaf of a set has
        its tier's bit and exactly one entry, at or below its tick; no node has two entries."""
        out = []
        nodes = self.tree.nodes
        for tier, (heap, live) in enumerate(zip(self._heaps, self.leaves, strict=False)):
            bit, rule = 1 << tier, f"{name}.{TIERS[tier].label}_leaf_heap"
            entries: dict[int, list[int]] = {}
            for e in heap:
                nid = e & _ID
                if nid in nodes:
                    entries.setdefault(nid, []).append(e >> _SHIFT)
            for nid, ticks in entries.items():
                node = nodes[nid]
                if len(ticks) > 1:
                    out.append((rule, nid, f"{len(ticks)} heap entries (one per node)"))
                if not node.in_heap & bit:
                    out.append((rule, nid, "has a heap entry but its in_heap bit is clear"))
            for nid in live:
                node = nodes[nid]
                ticks = entries.get(nid)
                if not ticks:
                    out.append((rule, nid, "evictable leaf with no heap entry: never evicted"))
                elif max(ticks) > node.last_access:
                    out.append((rule, nid, f"heap tick {max(ticks)} past its last access "
                                           f"{node.last_access}: evicted out of LRU order"))
        return out

    def refile_leaf(self, node: Node, tier: int) -> None:
        """Give back an entry ``pop_leaf`` returned but the caller did not evict (eviction
        skips a leaf whose host-only subtree is pinned): it stays a leaf, so it must stay
        findable."""
        if node.id in self.leaves[tier]:
            self._file(node, tier)

    def _compact_heaps(self) -> None:
        """Rebuild a heap from its set (entries of deleted nodes dropped; one per node)."""
        nodes = self.tree.nodes
        for tier, (heap, live) in enumerate(zip(self._heaps, self.leaves, strict=False)):
            if len(heap) > 4 * len(live) + 1024:
                bit = 1 << tier
                for e in heap:
                    node = nodes.get(e & _ID)
                    if node is not None:
                        node.in_heap &= ~bit
                heap[:] = [nodes[i].last_access << _SHIFT | i for i in live]  # in place: aliases stay
                for i in live:
                    nodes[i].in_heap |= bit
                heapq.heapify(heap)


__all__ = ["LeafSets", "entry_id", "heap_entry"]
