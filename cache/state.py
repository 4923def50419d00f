"""The cache's state and the one place every state change passes through.

``CacheCore`` owns the tree, the pools, the per-component ledgers (evictable / protected per
tier), the FULL evictable-leaf heaps (device D-leaves, host H-leaves: ``leaves.py``), the
auxiliary recency lists, the lock table and the recorder. Its primitives (``set_value``,
``split``, ``delete``, ``touch``; ``acquire`` and ``release`` in ``pins.py``) keep all of those
in step *and* emit the matching mutation, so a state change cannot happen without being
recorded. Public operations live in ``hiradix.py``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import torch

from radixscope.cache import events as ev
from radixscope.cache.components import BACKBONE, WINDOW, build_components
from radixscope.cache.config import CacheConfig
from radixscope.cache.errors import CacheOutOfMemory, StaleHandle
from radixscope.cache.events import Recorder
from radixscope.cache.leaves import LeafSets
from radixscope.cache.memory import check_fits
from radixscope.cache.pins import LockEntry, Pins
from radixscope.cache.pools import KVPool, StatePool, _np
from radixscope.cache.recording import Recording
from radixscope.cache.tiers import DEVICE, HOST, N_TIERS, STORAGE, TIER_LABELS, TIERS, per_tier
from radixscope.cache.tree import Node, RadixTree

log = logging.getLogger("radixscope.cache")


_TIER_INTS = tuple(range(N_TIERS))
assert N_TIERS == 3, "delete's freed dicts are one per tier"


def _stored_numel(value) -> int:
    return value.numel()


class CacheCore(Pins, LeafSets, Recording):
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
        self._pool_tier_of = {t.label: t for t in self.pool_tiers}  # ``_tier_of``'s table

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
            self._ledger.pool(ci, tier, alloc.available)
        return n

    def take_slots(self, ci: int, tier: int, n: int) -> torch.Tensor | None:
        alloc = self.pool(ci, tier).alloc
        out = alloc.alloc(n)
        if out is not None and n and self._on:
            self._ledger.pool(ci, tier, alloc.available)
        return out

    def oom(self, ci: int, tier: int, requested: int, note: str = "") -> CacheOutOfMemory:
        return CacheOutOfMemory(self.comps[ci].name, TIER_LABELS[tier], requested,
                                self.pool(ci, tier).alloc.available, self.evictable[ci][tier],
                                self.protected[ci][tier], note)

    # ---- component values ----------------------------------------------------------------
    def set_value(self, node: Node, ci: int, tier: int, value: torch.Tensor | None,
                  pages=None) -> None:
        """Set (or clear, with None) one component's value on one tier, keeping ledgers, leaf
        sets and recency lists in step. Does not free slots (callers free what they drop).
        ``pages``: the value as a numpy array when the caller has one (it skips a conversion)."""
        d = node.data[ci]
        comp = self.comps[ci]
        old = d.values[tier]
        led = self.protected[ci] if d.refs[tier] > 0 else self.evictable[ci]
        # slot tensors on the tiers with pools; a StoredPages (its own numel) on STORAGE
        size = self._sizes[ci] if tier != STORAGE else _stored_numel
        if old is not None:
            led[tier] -= size(old)
        n = None
        if value is not None:
            n = size(value)
            led[tier] += n
        d.values[tier] = value
        if tier == DEVICE:  # the device tier alone keeps tree-ownership marks and D-leaf counts
            alloc = self.device_pools[ci].alloc
            if old is not None:
                alloc.mark_tree(old, False)
            if value is not None:
                alloc.mark_tree(value if pages is None else pages, True)
            if ci == 0 and (old is None) != (value is None) and node.parent is not None:
                node.parent.device_children += 1 if value is not None else -1
                self.refresh_leaf(node.parent)
        if comp.uses_lru:
            self._lru_place(node, ci)
        if ci == 0:
            self.refresh_leaf(node)
        if self._on:  # (the value's size as measured above: the ledger does not measure it again)
            self._ledger.state(node, ci, tier, n)

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

    # ---- structure -------------------------------------------------------------------------
    def new_leaf(self, parent: Node, key, extra_key: object) -> Node:
        node = self.tree.new_child(parent, key, extra_key)
        if self._on:
            self._ledger.m(ev.NODE_CREATE, node.id, None, None, (parent.id, extra_key, key))
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
                    entry.named = None
        for ids in self.transfer_nodes.values():
            if child.id in ids:
                ids.insert(ids.index(child.id) + 1, new.id)
        if child.id in self.loading:
            self.loading[new.id] = self.loading[child.id]
        for comp in self.comps:
            if comp.uses_lru:
                self._lru_place(new, comp.index)
        if self._on:
            self._ledger.m(ev.NODE_SPLIT, child.id, None, None,
                    (new.id, k, tuple(self.comps[ci].name for ci in ref_cis)))
            for ci in range(len(self.comps)):
                self._ledger.state(new, ci)
                self._ledger.state(child, ci)
        return new

    def delete(self, node: Node, defer: dict | None = None, defer_tier: int = DEVICE
               ) -> tuple[dict[int, int], ...]:
        """Free every value of a childless, unpinned node and remove it (a STORAGE value is
        dropped without freeing anything: the pages stay in L3). Returns the slots freed per
        component index, one dict per tier.

        Each value goes as ``set_value(node, ci, tier, None)`` and ``free_slots`` would take
        it (the same ledgers, marks and pool records, in the same order), fused: the node is
        leaving the tree, so its own leaf and recency filing is dropped once at the end, and a
        device value's tree marks are cleared by the free itself. The values are not recorded
        one by one: the node's one ``node.delete`` drops every value it still held (a replay
        drops the node's last ``comp.state`` with it; ``events.py``), which saves eviction a
        state record a value on the hot path. With ``defer`` (an eviction's
        ``(ci, tier) -> [values]``), the frees on ``defer_tier`` (the tier being evicted) are
        left to ``free_deferred``: one per pool for all the victims of an eviction call. Only
        that tier's: a write-back during the same call may need the other tier's slots."""
        freed: tuple[dict[int, int], ...] = ({}, {}, {})  # one per tier (DEVICE, HOST, STORAGE)
        on = self._on
        pools = self.pools
        for ci, d in enumerate(node.data):
            vals = d.values
            for tier in _TIER_INTS:  # plain ints: a list indexed by an IntEnum takes a slow path
                v = vals[tier]
                if v is None:
                    continue
                n = self._sizes[ci](v) if tier != STORAGE else _stored_numel(v)
                (self.protected[ci] if d.refs[tier] > 0 else self.evictable[ci])[tier] -= n
                vals[tier] = None
                if ci == 0 and tier == DEVICE:
                    node.parent.device_children -= 1
                pool = pools[ci][tier]
                if pool is None:
                    continue
                if defer is not None and tier == defer_tier:
                    defer.setdefault((ci, tier), []).append(v)
                    freed[tier][ci] = n
                    continue
                alloc = pool.alloc
                freed[tier][ci] = alloc.free_owned(v, tree=tier == DEVICE)
                if on:
                    self._ledger.pool(ci, tier, alloc.available)
            if self.lru[ci] is not None:
                for lru in self.lru[ci]:
                    lru.pop(node.id, None)
        for live in self.leaves:
            live.discard(node.id)
        parent = node.parent
        self.tree.detach(node)
        if on:
            self._ledger.m(ev.NODE_DELETE, node.id, None, None, None)
        self.refresh_leaf(parent)
        return freed

    def free_deferred(self, defer: dict) -> None:
        """Free the values ``delete(..., defer)`` left: one free (and one pool record) per
        pool; device values' tree marks go in the same pass. Empties ``defer``."""
        for (ci, tier), vals in defer.items():
            alloc = self.pools[ci][tier].alloc
            pages = vals[0] if len(vals) == 1 else np.concatenate([_np(v) for v in vals])
            alloc.free_owned(pages, tree=tier == DEVICE)
            if self._on:
                self._ledger.pool(ci, tier, alloc.available)
        defer.clear()

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
        while cur.parent is not None:  # leaf heaps re-file when popped (``pop_leaf``)
            path.append(cur)
            cur.last_access = t
            cur.hit_count += 1
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
            self._ledger.m(ev.NODE_TOUCH, node.id, None, None, t)

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
