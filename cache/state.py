"""The cache's state and the one place every state change passes through.

``CacheCore`` owns the tree, the pools, the per-component ledgers (evictable / protected per
tier), the FULL evictable-leaf heaps (device D-leaves, host H-leaves), the auxiliary recency lists,
the lock table and the recorder. Its primitives (``set_value``, ``acquire``, ``release``,
``split``, ``delete``, ``touch``) keep all of those in step *and* emit the matching mutation, so
a state change cannot happen without being recorded. Public operations live in ``hiradix.py``.
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict

import torch

from radixscope.cache import events as ev
from radixscope.cache.components import BACKBONE, WINDOW, build_components
from radixscope.cache.config import CacheConfig
from radixscope.cache.errors import CacheOutOfMemory, StaleHandle
from radixscope.cache.events import Recorder
from radixscope.cache.leaves import LeafSets
from radixscope.cache.memory import check_fits
from radixscope.cache.pools import KVPool, StatePool
from radixscope.cache.recording import Recording
from radixscope.cache.tiers import DEVICE, HOST, STORAGE, TIER_LABELS, TIERS, per_tier
from radixscope.cache.tree import Node, RadixTree

log = logging.getLogger("radixscope.cache")


def _stored_numel(value) -> int:
    return value.numel()


class LockEntry:
    """A live lock: the nodes pinned per component index (bottom-up order)."""

    __slots__ = ("receipt_id", "owner", "anchor", "tier", "pins")

    def __init__(self, receipt_id: int, owner: str | None, anchor: int, tier: int,
                 pins: dict[int, list[int]]) -> None:
        self.receipt_id = receipt_id
        self.owner = owner
        self.anchor = anchor
        self.tier = tier
        self.pins = pins


class CacheCore(LeafSets, Recording):
    storage = None  # the StorageSetup of an L3 tier (``HiRadixCache(..., storage=...)``)

    def __init__(self, config: CacheConfig, recorder: Recorder | None = None) -> None:
        if not isinstance(config, CacheConfig):
            raise TypeError(f"config must be a CacheConfig, got {type(config).__name__}")
        self.config = config
        self.page_size = config.page_size
        self.comps = build_components(config)
        self.ci = {c.name: c.index for c in self.comps}
        self._sizes = [c.size_fn() for c in self.comps]  # per component: value -> slots
        self.tree = RadixTree(config.page_size, len(self.comps))
        self._build_pools()
        n = len(self.comps)
        # per component, per tier (``Tier`` indexes the inner lists)
        self.evictable = [per_tier(0) for _ in range(n)]
        self.protected = [per_tier(0) for _ in range(n)]
        self._init_leaves()
        self.lru = [[OrderedDict() for _ in TIERS] if c.uses_lru else None for c in self.comps]
        self.locks: dict[int, LockEntry] = {}
        self.transfers: dict = {}          # transfer id -> Transfer (in flight)
        self.store_transfers: dict = {}    # transfer id -> Transfer of kind "store" (L3 writes)
        self.transfer_nodes: dict[int, list[int]] = {}
        # node id -> ids of the load-backs in flight whose copies write that node's device data
        self.loading: dict[int, tuple[int, ...]] = {}
        self.cow_pending: dict[int, int] = {}  # request MAMBA slot -> load-back still writing it
        self._next_receipt = 1
        self._next_transfer = 1
        self._tick = 0
        self._init_recording(recorder)

    # ---- construction ------------------------------------------------------------------
    def _build_pools(self) -> None:
        c = self.config
        check_fits(c)  # NotEnoughMemory (a ValueError) naming the bytes, before any allocation
        cuda = c.device.startswith("cuda")
        # pools[ci][tier]; None where a tier has no pool (STORAGE: values are page hashes)
        self.pools: list[list] = []
        for comp in self.comps:
            if comp.name == BACKBONE:
                dev = KVPool("full/device", c.layers, c.device_tokens, c.heads, c.head_dim,
                             c.dtype, c.device, c.page_size)
                host = KVPool("full/host", c.layers, c.host_tokens, c.heads, c.head_dim,
                              c.dtype, "cpu", c.page_size, pin=cuda)
            elif comp.name == WINDOW:
                dev = KVPool("swa/device", c.swa_layers, c.swa_device_tokens, c.heads, c.head_dim,
                             c.dtype, c.device, c.page_size)
                host = KVPool("swa/host", c.swa_layers, c.swa_host_tokens, c.heads, c.head_dim,
                              c.dtype, "cpu", c.page_size, pin=cuda)
            else:
                dev = StatePool("mamba/device", c.mamba_slots, c.mamba_state_shape, c.dtype,
                                c.device)
                host = StatePool("mamba/host", c.mamba_host_slots, c.mamba_state_shape, c.dtype,
                                 "cpu", pin=cuda)
            tiers = per_tier(None)
            tiers[DEVICE], tiers[HOST] = dev, host
            self.pools.append(tiers)
        self.device_pools = [p[DEVICE] for p in self.pools]
        self.host_pools = [p[HOST] for p in self.pools]
        # the tiers that have pools (in Tier order): what snapshots, info and checks walk
        self.pool_tiers = tuple(t for t in TIERS if self.pools[0][t] is not None)

    def pool(self, ci: int, tier: int):
        p = self.pools[ci][tier]
        if p is None:
            raise ValueError(f"{self.comps[ci].name}: tier {TIER_LABELS[tier]!r} has no pool")
        return p

    # ---- hooks the executor provides ---------------------------------------------------------
    def save_to_host(self, node: Node, cis: set[int] | None = None) -> bool:
        """Write-back: copy ``node``'s device data (only components ``cis`` when given) to host
        and wait for it; False when the host tier had no room. Eviction calls this before
        dropping unbacked data; ``HiRadixCache`` implements it with its transfer engine (so
        eviction and transfers do not import each other)."""
        raise NotImplementedError

    # ---- slots ---------------------------------------------------------------------------
    def free_slots(self, ci: int, tier: int, idx: torch.Tensor, checked=None) -> int:
        """Free slots the cache holds (a node's value, or request slots already validated);
        ``checked``: the page ids a public ``free`` validated in full."""
        alloc = self.pool(ci, tier).alloc
        n = alloc.free_owned(idx) if checked is None else alloc.free(idx, checked)
        if self._on:
            self._emit_pool(ci, tier, alloc.available)
        return n

    def take_slots(self, ci: int, tier: int, n: int) -> torch.Tensor | None:
        alloc = self.pool(ci, tier).alloc
        out = alloc.alloc(n)
        if out is not None and n and self._on:
            self._emit_pool(ci, tier, alloc.available)
        return out

    def oom(self, ci: int, tier: int, requested: int, note: str = "") -> CacheOutOfMemory:
        return CacheOutOfMemory(self.comps[ci].name, TIER_LABELS[tier], requested,
                                self.pool(ci, tier).alloc.available, self.evictable[ci][tier],
                                self.protected[ci][tier], note)

    # ---- component values ----------------------------------------------------------------
    def set_value(self, node: Node, ci: int, tier: int, value: torch.Tensor | None) -> None:
        """Set (or clear, with None) one component's value on one tier, keeping ledgers, leaf
        sets and recency lists in step. Does not free slots (callers free what they drop)."""
        d = node.data[ci]
        comp = self.comps[ci]
        old = d.values[tier]
        led = self.protected[ci] if d.refs[tier] > 0 else self.evictable[ci]
        # slot tensors on the tiers with pools; a StoredPages (its own numel) on STORAGE
        size = self._sizes[ci] if tier != STORAGE else _stored_numel
        if old is not None:
            led[tier] -= size(old)
        if value is not None:
            led[tier] += size(value)
        d.values[tier] = value
        if tier == DEVICE:  # the device tier alone keeps tree-ownership marks and D-leaf counts
            alloc = self.device_pools[ci].alloc
            if old is not None:
                alloc.mark_tree(old, False)
            if value is not None:
                alloc.mark_tree(value, True)
            if ci == 0 and (old is None) != (value is None) and node.parent is not None:
                node.parent.device_children += 1 if value is not None else -1
                self.refresh_leaf(node.parent)
        if comp.uses_lru:
            self._lru_place(node, ci)
        if ci == 0:
            self.refresh_leaf(node)
        if self._on:
            self._emit_state(node, ci)

    def _lru_place(self, node: Node, ci: int) -> None:
        """File the node in the recency list of the fastest tier holding its value (and in no
        other)."""
        nid = node.id
        placed = False
        for lru, v in zip(self.lru[ci], node.data[ci].values, strict=False):
            if v is not None and not placed:
                placed = True
                if nid not in lru:
                    lru[nid] = node
            else:
                lru.pop(nid, None)

    # ---- locks -----------------------------------------------------------------------------
    def acquire(self, anchor: Node, tier: int, pins: dict[int, list[Node]], owner) -> int:
        """Pin nodes (lock_ref on device, host_ref on host) and register the lock."""
        rid = self._next_receipt
        self._next_receipt += 1
        first: dict[int, Node] = {}  # nodes that went from unpinned to pinned on this tier
        for ci, nodes in pins.items():
            size = self._sizes[ci]
            moved = 0  # slots going from evictable to protected
            for node in nodes:
                d = node.data[ci]
                refs = d.refs
                if not refs[tier]:
                    first[node.id] = node
                    v = d.values[tier]
                    if v is not None:
                        moved += size(v)
                refs[tier] += 1
            if moved:
                self.evictable[ci][tier] -= moved
                self.protected[ci][tier] += moved
        entry = LockEntry(rid, owner, anchor.id, tier,
                          {ci: [n.id for n in pins[ci]] for ci in sorted(pins) if pins[ci]})
        self.locks[rid] = entry
        for node in first.values():
            # a node with FULL on device under a device child is never a leaf: skip the call
            if not node.device_children or node.data[0].values[DEVICE] is None:
                self.refresh_leaf(node)
        if self._on:
            self._m(ev.LOCK_ACQUIRE, anchor.id, None, TIER_LABELS[tier], (rid, owner, self._pins_out(entry)))
        return rid

    def _pins_out(self, entry: LockEntry, cis=None) -> tuple:
        # entry.pins is in component order (built from sorted pins; releases only delete)
        comps = self.comps
        return tuple([(comps[ci].name, tuple(ids)) for ci, ids in entry.pins.items()
                      if cis is None or ci in cis])

    def release(self, entry: LockEntry, cis: set[int] | None = None) -> None:
        """Unpin ``entry``'s nodes; with ``cis``, only those components (a partial release that
        keeps the lock live), otherwise all of them, retiring the lock."""
        nodes = self.tree.nodes
        out = self._pins_out(entry, cis) if self._on else None
        touched = {}
        tier = entry.tier
        for ci in sorted(entry.pins):
            if cis is not None and ci not in cis:
                continue
            size = self._sizes[ci]
            moved = 0  # slots going from protected to evictable
            for nid in entry.pins[ci]:
                node = nodes[nid]
                d = node.data[ci]
                refs = d.refs
                refs[tier] -= 1
                if not refs[tier]:
                    touched[nid] = node
                    v = d.values[tier]
                    if v is not None:
                        moved += size(v)
            if moved:
                self.protected[ci][tier] -= moved
                self.evictable[ci][tier] += moved
        for ci in list(entry.pins):
            if cis is None or ci in cis:
                del entry.pins[ci]
        final = cis is None
        if final:
            del self.locks[entry.receipt_id]
        for node in touched.values():
            if not node.device_children or node.data[0].values[DEVICE] is None:
                self.refresh_leaf(node)
        if self._on:
            self._m(ev.LOCK_RELEASE, entry.anchor, None, TIER_LABELS[entry.tier],
                    (entry.receipt_id, out, final))

    # ---- structure -------------------------------------------------------------------------
    def new_leaf(self, parent: Node, key, extra_key: object) -> Node:
        node = self.tree.new_child(parent, key, extra_key)
        if self._on:
            self._m(ev.NODE_CREATE, node.id, None, None, (parent.id, extra_key, key))
        self.refresh_leaf(parent)
        return node

    def split(self, child: Node, k: int) -> Node:
        """Split ``child`` after ``k`` tokens; returns the new parent (the child keeps its id)."""
        new = self.tree.split(child, k)
        ref_cis = []
        for comp in self.comps:
            comp.split(child.data[comp.index], new.data[comp.index], k)
            if comp.copies_refs_on_split:
                ref_cis.append(comp.index)
        new.device_children = 1 if child.data[0].values[DEVICE] is not None else 0
        for entry in self.locks.values():
            for ci in ref_cis:
                ids = entry.pins.get(ci)
                if ids and child.id in ids:
                    ids.insert(ids.index(child.id) + 1, new.id)
        for ids in self.transfer_nodes.values():
            if child.id in ids:
                ids.insert(ids.index(child.id) + 1, new.id)
        if child.id in self.loading:
            self.loading[new.id] = self.loading[child.id]
        for comp in self.comps:
            if comp.uses_lru:
                self._lru_place(new, comp.index)
        if self._on:
            self._m(ev.NODE_SPLIT, child.id, None, None,
                    (new.id, k, tuple(self.comps[ci].name for ci in ref_cis)))
            for ci in range(len(self.comps)):
                self._emit_state(new, ci)
                self._emit_state(child, ci)
        return new

    def delete(self, node: Node) -> tuple[dict[int, int], ...]:
        """Free every value of a childless, unpinned node and remove it (a STORAGE value is
        dropped without freeing anything: the pages stay in L3). Returns the slots freed per
        component index, one dict per tier."""
        freed: tuple[dict[int, int], ...] = tuple({} for _ in TIERS)
        for ci in range(len(self.comps)):
            d = node.data[ci]
            for tier in TIERS:
                v = d.values[tier]
                if v is not None:
                    self.set_value(node, ci, tier, None)
                    if self.pools[ci][tier] is not None:
                        freed[tier][ci] = self.free_slots(ci, tier, v)
            if self.lru[ci] is not None:
                for lru in self.lru[ci]:
                    lru.pop(node.id, None)
        for live in self.leaves:
            live.discard(node.id)
        parent = node.parent
        self.tree.detach(node)
        if self._on:
            self._m(ev.NODE_DELETE, node.id, None, None, None)
        self.refresh_leaf(parent)
        return freed

    def touch(self, node: Node) -> None:
        """Recency: the node and its ancestors get a new access tick and one more hit; each
        auxiliary component refreshes its own span of the path (SWA: the window; MAMBA: the
        end node)."""
        if node.parent is None:
            return
        self._tick += 1
        t = self._tick
        path = []
        cur = node
        while cur.parent is not None:
            path.append(cur)
            cur.last_access = t
            cur.hit_count += 1
            nid = cur.id
            if nid in self.d_leaves:
                heapq.heappush(self._d_heap, (t, nid))
            elif nid in self.h_leaves:
                heapq.heappush(self._h_heap, (t, nid))
            cur = cur.parent
        for comp in self.comps:
            if not comp.uses_lru:
                continue
            lrus = self.lru[comp.index]
            for x in reversed(path[:comp.recency_span(path)]):  # deepest ends up most recent
                for lru in lrus:
                    if x.id in lru:
                        lru.move_to_end(x.id)
                        break
        if self._on:
            self._m(ev.NODE_TOUCH, node.id, None, None, t)
        if len(self._d_heap) > 4 * len(self.d_leaves) + 1024 or \
                len(self._h_heap) > 4 * len(self.h_leaves) + 1024:
            self._compact_heaps()

    def node(self, node_id: int) -> Node:
        if isinstance(node_id, bool) or not isinstance(node_id, int):
            raise TypeError(f"node must be an int node id, got {node_id!r}")
        n = self.tree.nodes.get(node_id)
        if n is None:
            raise StaleHandle(f"node {node_id} is not in the tree (deleted, or never existed)")
        return n

    @property
    def root(self) -> Node:
        return self.tree.root
