"""FULL's evictable leaves: per tier, the set of leaf ids eviction may take and a lazy LRU heap
of (access tick, id) over them, so eviction pops the least recently used leaf without a scan.

A mixin of ``CacheCore``: its primitives (``set_value``, ``acquire``, ``release``, ``split``,
``delete``, ``touch``) call ``refresh_leaf`` after every change that can make or unmake a leaf;
eviction calls ``pop_leaf``. Heap entries go stale when a node is touched (a newer entry is
pushed) or leaves the set; ``pop_leaf`` skips them, and ``_compact_heaps`` rebuilds a heap in
place once stale entries outnumber live ones four to one.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from radixscope.cache.tiers import DEVICE, HOST, TIERS

if TYPE_CHECKING:
    from radixscope.cache.tree import Node, RadixTree


class LeafSets:
    """The evictable-leaf sets and heaps of FULL, per tier."""

    tree: RadixTree

    def _init_leaves(self) -> None:
        self.leaves: list[set[int]] = [set() for _ in TIERS]
        self._heaps: list[list[tuple[int, int]]] = [[] for _ in TIERS]
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
                    heapq.heappush(self._d_heap, (node.last_access, nid))
            else:
                self.d_leaves.discard(nid)
            return
        self.d_leaves.discard(nid)
        if (f.values[HOST] is not None and not node.children
                and not any(any(d.refs) for d in node.data)):
            if nid not in self.h_leaves:
                self.h_leaves.add(nid)
                heapq.heappush(self._h_heap, (node.last_access, nid))
        else:
            self.h_leaves.discard(nid)

    def pop_leaf(self, tier: int) -> Node | None:
        """The least recently used evictable leaf of a tier, or None. O(log n) amortised."""
        heap, live = self._heaps[tier], self.leaves[tier]
        nodes = self.tree.nodes
        while heap:
            t, nid = heapq.heappop(heap)
            if nid in live:
                node = nodes[nid]
                if node.last_access == t:
                    return node
        return None

    def _compact_heaps(self) -> None:
        nodes = self.tree.nodes
        for heap, live in zip(self._heaps, self.leaves, strict=False):
            if len(heap) > 4 * len(live) + 1024:
                heap[:] = [(nodes[i].last_access, i) for i in live]  # in place: aliases stay
                heapq.heapify(heap)


__all__ = ["LeafSets"]
