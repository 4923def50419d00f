"""Eviction: LRU victims from incrementally kept sets, the FULL > SWA > MAMBA cascade,
whole-node eviction of FULL leaves, and tombstone-ancestor deletion that stops at any node a
lock or a transfer still references (seed bug class 2).

Victim order: FULL pops the least recently used evictable device leaf from a heap (O(log n), no
scan); SWA and MAMBA walk their own recency lists from the cold end, skipping pinned nodes.

A node is deleted only when its FULL data goes. Auxiliary (SWA / MAMBA) pressure frees that
component in its own LRU order and keeps FULL, on leaves too: the node stays (a tombstone for
that component) and still serves its FULL prefix; insert heals it. Under write_back the
auxiliary data is copied to host before it leaves the device, so the node stays a match boundary
(a load-back revives it). Host pressure on an auxiliary component likewise frees only that
component's host copies.
"""

from __future__ import annotations

from radixscope.cache.components import STATE
from radixscope.cache.leaves import pinned
from radixscope.cache.results import EvictResult
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import DEVICE, HOST, RESIDENT
from radixscope.cache.tree import Node

assert RESIDENT == (DEVICE, HOST), "is_useless checks the resident tiers by name"


class _Acc:
    """What one eviction call did, in order."""

    def __init__(self, core: CacheCore) -> None:
        self.core = core
        self.defer: dict = {}  # deleted victims' values, freed together (``free_deferred``)
        self.freed = [0] * len(core.comps)
        self.evicted: list[int] = []
        self.demoted: list[int] = []
        self.deleted: list[int] = []
        self.tombstoned: list[tuple[str, int]] = []

    def add(self, freed: dict[int, int]) -> None:
        for ci, n in freed.items():
            self.freed[ci] += n

    def result(self, ci: int, requested: int) -> EvictResult:
        self.core.free_deferred(self.defer)
        names = [c.name for c in self.core.comps]
        return EvictResult(requested, tuple(zip(names, self.freed, strict=False)),
                           tuple(self.evicted), tuple(self.demoted), tuple(self.deleted),
                           tuple(self.tombstoned), names[ci])


def _post_order(node: Node) -> list[Node]:
    if not node.children:
        return [node]
    out, stack = [], [(node, False)]
    while stack:
        n, done = stack.pop()
        if done:
            out.append(n)
        else:
            stack.append((n, True))
            stack.extend((c, False) for c in n.children.values())
    return out


def is_useless(node: Node) -> bool:
    """A node some component can never accept as a match end (no data on a resident tier;
    pages in L3 are found by hashing, not through the node). A plain loop: this runs on every
    victim's parent (a third of the cost of nested generators)."""
    for d in node.data:
        v = d.values
        if v[DEVICE] is None and v[HOST] is None:
            return True
    return False


class Eviction(CacheCore):
    """LRU eviction on the device and host tiers: methods of ``HiRadixCache``."""

    def _evict_device(self, ci: int, num: int) -> EvictResult:
        """Free at least ``num`` device slots of component ``ci`` (fewer if nothing else is evictable)."""
        acc = _Acc(self)
        if ci == 0:
            skipped: list[Node] = []  # popped but left resident: filed again below
            leaf = None
            try:
                while acc.freed[0] < num:
                    leaf = self.pop_leaf(DEVICE)
                    if leaf is None:
                        break
                    if not self._evict_leaf(leaf, acc):
                        # a write-back that found no host room released its pins, which filed
                        # the leaf again: out until the call ends, or it is popped forever
                        self.d_leaves.discard(leaf.id)
                        skipped.append(leaf)
                    leaf = None
            except BaseException:
                self.free_deferred(acc.defer)  # a failing victim: the others' slots still go
                if leaf is not None:
                    skipped.append(leaf)  # the victim that failed stays findable
                raise
            finally:
                self._refile(skipped)
            return acc.result(ci, num)
        lru = self.lru[ci][DEVICE]
        while acc.freed[ci] < num:
            victim = next((n for n in lru.values() if n.data[ci].refs[DEVICE] == 0), None)
            if victim is None:
                break
            self._tombstone(victim, ci, acc)
        return acc.result(ci, num)

    def _refile(self, leaves: list[Node]) -> None:
        """File again the leaves an eviction popped but did not remove (skipped, or failed):
        each where its state now puts it (a failed victim may have changed part way)."""
        for leaf in leaves:
            if leaf.id in self.tree.nodes:
                self.refresh_leaf(leaf)

    def _tombstone(self, node: Node, ci: int, acc: _Acc) -> None:
        """Drop component ``ci``'s device data on a node (leaf or internal), cascading to lower
        priorities (pinned lower components are spared). FULL stays: the node keeps its place in
        the tree. Under write_back the dropped data is first copied to host (when there is room)."""
        pri = self.comps[ci].priority
        drop = [comp.index for comp in self.comps
                if comp.priority <= pri and node.data[comp.index].values[DEVICE] is not None
                and node.data[comp.index].refs[DEVICE] == 0]
        if (self.config.write_policy == "write_back" and self.config.has_host
                and any(node.data[cj].values[HOST] is None for cj in drop)):
            self.save_to_host(node, set(drop))
        for cj in drop:
            comp = self.comps[cj]
            d = node.data[cj]
            if d.values[DEVICE] is None or d.refs[DEVICE] > 0:
                continue
            v = d.values[DEVICE]
            self.set_value(node, comp.index, DEVICE, None)
            acc.freed[comp.index] += self.free_slots(comp.index, DEVICE, v)
            acc.tombstoned.append((comp.name, node.id))

    def _evict_leaf(self, node: Node, acc: _Acc) -> bool:
        """Evict a device leaf whole: demote it to host-only when backed up (under write_back, back
        it up synchronously first), otherwise delete it and its useless childless ancestors.

        Under write_back a device leaf may still have host-only children (their backups succeeded,
        its own failed): then the unpinned host-only subtree is dropped with it; if anything in that
        subtree is pinned, the node stays resident (it is skipped, not corrupted). Returns whether
        the node was evicted."""
        f = node.data[0]
        if f.values[HOST] is None and self.config.write_policy == "write_back" and self.config.has_host:
            self.save_to_host(node)
        if f.values[HOST] is not None:
            acc.evicted.append(node.id)
            for comp in self.comps:
                d = node.data[comp.index]
                if d.values[DEVICE] is not None:
                    v = d.values[DEVICE]
                    self.set_value(node, comp.index, DEVICE, None)
                    acc.freed[comp.index] += self.free_slots(comp.index, DEVICE, v)
            acc.demoted.append(node.id)
            return True
        # a plain loop: cheaper than ``any`` over a generator, on every victim
        subtree = _post_order(node) if node.children else (node,)
        for n in subtree:
            if pinned(n):  # a host pin (an L3 prefetch's path), or a pinned host-only child
                return False  # leave this node resident
        acc.evicted.append(node.id)
        parent = node.parent
        for n in subtree:  # children first, so every delete is of a childless node
            acc.add(self.delete(n, acc.defer)[DEVICE])
            acc.deleted.append(n.id)
        self._delete_tombstone_ancestors(parent, acc, DEVICE)
        return True

    def _delete_tombstone_ancestors(self, node: Node, acc: _Acc, tier: int) -> None:
        """Walk up deleting childless useless nodes. Stops at the root and at any node with a
        lock_ref or host_ref on any component: a lock or an in-flight transfer still needs it."""
        while (node.parent is not None and not node.children and is_useless(node)
               and not pinned(node)):
            parent = node.parent
            acc.add(self.delete(node, acc.defer, tier)[tier])
            acc.deleted.append(node.id)
            node = parent

    def _evict_host_slots(self, ci: int, num: int) -> EvictResult:
        """Free at least ``num`` host slots of component ``ci``."""
        acc = _Acc(self)
        if ci == 0:
            leaf = None
            try:
                while acc.freed[0] < num:
                    leaf = self.pop_leaf(HOST)
                    if leaf is None:
                        break
                    self._evict_host_leaf(leaf, acc)
                    leaf = None
            except BaseException:
                self.free_deferred(acc.defer)
                if leaf is not None:  # an L3 write-back that raised: the leaf stays findable
                    self._refile([leaf])
                raise
            return acc.result(ci, num)
        lru = self.lru[ci][HOST]
        while acc.freed[ci] < num:  # only this component's host copy goes; FULL's host copy stays
            victim = next((n for n in lru.values() if n.data[ci].refs[HOST] == 0), None)
            if victim is None:
                break
            v = victim.data[ci].values[HOST]
            self.set_value(victim, ci, HOST, None)
            acc.freed[ci] += self.free_slots(ci, HOST, v)
            acc.tombstoned.append((self.comps[ci].name, victim.id))
        return acc.result(ci, num)

    def _evict_host_leaf(self, node: Node, acc: _Acc) -> None:
        if self.storage is not None and self.storage.write_policy == "write_back":
            self._write_back_leaf(node)  # L3 write-back: last chance before the pages go
        acc.evicted.append(node.id)
        parent = node.parent
        acc.add(self.delete(node, acc.defer, HOST)[HOST])
        acc.deleted.append(node.id)
        self._delete_tombstone_ancestors(parent, acc, HOST)

    def _enforce_mamba_cap(self, tail: Node) -> None:
        """Keep at most ``mamba_max_states_per_path`` device states on ``tail``'s root path by
        tombstoning the shallowest unpinned single-child holders (never the tail or a fork)."""
        cap = self.config.mamba_max_states_per_path
        if cap is None:
            return
        mi = self.ci[STATE]
        holders = [n for n in self.tree.path_to_root(tail) if n.data[mi].values[DEVICE] is not None]
        excess = len(holders) - cap
        for node in reversed(holders):  # shallowest first
            if excess <= 0:
                break
            d = node.data[mi]
            if node is tail or len(node.children) != 1 or d.refs[DEVICE] > 0:
                continue
            v = d.values[DEVICE]
            self.set_value(node, mi, DEVICE, None)
            self.free_slots(mi, DEVICE, v)
            excess -= 1


__all__ = ["Eviction", "is_useless"]
