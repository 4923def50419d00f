"""``check()``: every promise the structure makes, verified by recount; and the live snapshot.

Both are read-only: no recency change, no records. ``check`` collects *all* violations and
raises one ``InvariantViolation`` listing them with node ids and numbers.
"""

from __future__ import annotations

import torch

from radixscope.cache import events as ev
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.snapshot import (
    CacheSnapshot,
    ComponentState,
    LockSnapshot,
    NodeSnapshot,
    PoolSnapshot,
    TransferSnapshot,
)
from radixscope.cache.tiers import (
    DEVICE,
    HOST,
    RESIDENT,
    STORAGE,
    TIER_LABELS,
    TIERS,
    Tier,
    per_tier,
)


class Invariants:
    """``check()`` and the live snapshot, as methods of the cache (mixed into ``HiRadixCache``)."""

    def _check_invariants(self) -> None:  # noqa: C901 - a flat list of checks reads best
        v: list[tuple[str, int | None, str]] = []
        comps, tree, page = self.comps, self.tree, self.page_size
        n_c = len(comps)
        write_through = self.config.write_policy != "write_back"
        # ---- tree links --------------------------------------------------------------------
        seen = {}
        stack = [tree.root]
        while stack:
            node = stack.pop()
            if node.id in seen:
                v.append(("tree.cycle", node.id, "node reached twice"))
                continue
            seen[node.id] = node
            for fk, child in node.children.items():
                if child.parent is not node:
                    v.append(("tree.parent_link", child.id, f"parent is {getattr(child.parent, 'id', None)}, "
                              f"filed under {node.id}"))
                if tree.file_key(node, child.key, 0, child.extra_key) != fk:
                    v.append(("tree.child_key", child.id, f"filed under {fk!r}"))
                stack.append(child)
        if set(seen) != set(tree.nodes):
            v.append(("tree.registry", None, f"unreachable {sorted(set(tree.nodes) - set(seen))[:8]}, "
                      f"unregistered {sorted(set(seen) - set(tree.nodes))[:8]}"))
        nodes = [n for n in seen.values() if n.parent is not None]
        # ---- lock table recount ----------------------------------------------------------------
        lock_count = {}
        for entry in self.locks.values():
            if entry.named is not None and entry.named != (pinned := self._pins_out(entry)):
                v.append(("lock.named_pins", entry.anchor, f"receipt {entry.receipt_id} names "
                          f"{entry.named} but pins {pinned}"))
            for ci, ids in entry.pins.items():
                for nid in ids:
                    if nid not in tree.nodes:
                        v.append(("lock.dead_pin", nid, f"receipt {entry.receipt_id} pins a deleted node"))
                    key = (nid, ci, entry.tier)
                    lock_count[key] = lock_count.get(key, 0) + 1
        # ---- per node ------------------------------------------------------------------------------
        ev_sum = [per_tier(0) for _ in range(n_c)]
        pr_sum = [per_tier(0) for _ in range(n_c)]
        owned: list[list[list[tuple[int, torch.Tensor]]]] = [[[] for _ in TIERS] for _ in range(n_c)]
        d_leaves, h_leaves = set(), set()
        lru_members = [[set() for _ in TIERS] for _ in range(n_c)]
        for node in nodes:
            nid = node.id
            if not node.key or len(node.key) % page:
                v.append(("node.key", nid, f"key length {len(node.key)} not a positive multiple of {page}"))
            f = node.data[0]
            if all(f.values[t] is None for t in RESIDENT):
                v.append(("node.dead", nid, "FULL holds no value on any tier with a pool"
                          + (" (only in storage: nodes leaving host and device are deleted)"
                             if f.values[STORAGE] is not None else "")))
            par = node.parent
            if f.refs[DEVICE] > 0 and par.parent is not None and par.data[0].refs[DEVICE] == 0:
                v.append(("full.lock_path_closed", nid, f"pinned (lock_ref {f.refs[DEVICE]}) under "
                          f"unpinned parent {par.id}: the parent counts as evictable but no leaf "
                          "eviction can reach it"))
            if f.refs[DEVICE] > 0 and f.values[DEVICE] is None:
                v.append((f"{comps[0].name}.pin_without_device", nid, f"lock_ref {f.refs[DEVICE]} "
                          "on a node holding no device value: a lock must skip (and record) an "
                          "evicted bottom segment"))
            if f.values[DEVICE] is not None and par.parent is not None and par.data[0].values[DEVICE] is None:
                v.append(("full.device_prefix_closed", nid, f"device value under device-evicted parent {par.id}"))
            if (write_through and f.values[HOST] is not None and par.parent is not None
                    and par.data[0].values[HOST] is None):
                v.append(("full.host_prefix_closed", nid, f"host value under unbacked parent {par.id}"))
            dev_children = sum(1 for c in node.children.values() if c.data[0].values[DEVICE] is not None)
            if dev_children != node.device_children:
                v.append(("tree.device_children", nid, f"counter {node.device_children}, recount {dev_children}"))
            for comp in comps:
                ci = comp.index
                d = node.data[ci]
                for tier, val in zip(TIERS, d.values, strict=False):
                    if val is None or (tier == STORAGE and self.storage is not None):
                        continue  # STORAGE values: _check_storage
                    if self.pools[ci][tier] is None:
                        v.append((f"{comp.name}.{tier.label}.no_pool", nid,
                                  f"holds a {tier.label} value but that tier has no pool"))
                        continue
                    want = 1 if comp.boundary_state else len(node.key)
                    if comp.size(val) != want or val.numel() != want:
                        v.append((f"{comp.name}.value_len", nid, f"{tier.label} value has {val.numel()} "
                                  f"slots, expected {want}"))
                    if comp.value_cap is not None and val.numel() > comp.value_cap:
                        v.append((f"{comp.name}.window_cap", nid, f"{tier.label} value has "
                                  f"{val.numel()} slots, more than one paged window "
                                  f"({comp.value_cap}): only the last window of a key keeps it"))
                    (pr_sum if d.refs[tier] > 0 else ev_sum)[ci][tier] += comp.size(val)
                    owned[ci][tier].append((nid, val))
                if any(r < 0 for r in d.refs):
                    v.append((f"{comp.name}.refs_negative", nid,
                              ", ".join(f"{t.ref_name} {r}" for t, r in zip(TIERS, d.refs, strict=False))))
                for tier, ref in zip(TIERS, d.refs, strict=False):
                    want = lock_count.get((nid, ci, tier), 0)
                    if ref != want:
                        v.append((f"{comp.name}.{tier.ref_name}", nid,
                                  f"{ref} but the lock table holds {want} pin(s)"))
                if ci:
                    if d.values[DEVICE] is not None and f.values[DEVICE] is None:
                        v.append((f"{comp.name}.device_without_full", nid, "auxiliary device value, FULL evicted"))
                    if d.values[HOST] is not None and f.values[HOST] is None and write_through:
                        v.append((f"{comp.name}.host_without_full", nid, "auxiliary host value, FULL not backed up"))
                    if d.refs[DEVICE] > f.refs[DEVICE]:
                        v.append((f"{comp.name}.lock_exceeds_full", nid, f"{d.refs[DEVICE]} > FULL {f.refs[DEVICE]}"))
                if comp.uses_lru:  # filed on the fastest tier holding a value
                    for tier, val in zip(TIERS, d.values, strict=False):
                        if val is not None:
                            lru_members[ci][tier].add(nid)
                            break
            unlocked = all(d.refs[DEVICE] == 0 for d in node.data)
            if f.values[DEVICE] is not None and f.refs[DEVICE] == 0 and dev_children == 0:
                d_leaves.add(nid)
            if (f.values[DEVICE] is None and f.values[HOST] is not None and not node.children and unlocked
                    and all(d.refs[HOST] == 0 for d in node.data)):
                h_leaves.add(nid)
        # ---- ledgers, leaf sets, recency lists --------------------------------------------------
        for comp in comps:
            ci = comp.index
            for tier in self.pool_tiers:
                tn = tier.label
                if self.evictable[ci][tier] != ev_sum[ci][tier]:
                    v.append((f"{comp.name}.{tn}.evictable_ledger", None,
                              f"ledger {self.evictable[ci][tier]}, recount {ev_sum[ci][tier]}"))
                if self.protected[ci][tier] != pr_sum[ci][tier]:
                    v.append((f"{comp.name}.{tn}.protected_ledger", None,
                              f"ledger {self.protected[ci][tier]}, recount {pr_sum[ci][tier]}"))
                self._check_pool(comp, tier, owned[ci][tier], v)
            if comp.uses_lru:
                for tier in TIERS:
                    have = set(self.lru[ci][tier])
                    if have != lru_members[ci][tier]:
                        v.append((f"{comp.name}.{tier.label}_lru", None,
                                  f"missing {sorted(lru_members[ci][tier] - have)[:8]}, "
                                  f"extra {sorted(have - lru_members[ci][tier])[:8]}"))
        for rule, filed, want in (("full.device_leaves", set(self.d_leaves), d_leaves),
                                  ("full.host_leaves", set(self.h_leaves), h_leaves)):
            if filed != want:
                v.append((rule, None, f"missing {sorted(want - filed)[:8]}, "
                                      f"extra {sorted(filed - want)[:8]}"))
        v.extend(self.leaf_heap_violations(self.comps[0].name))
        self._check_transfers(v)
        if self.storage is not None:
            self._check_storage(v)
        if v:
            raise InvariantViolation(v)

    def _check_transfers(self, v: list) -> None:
        """Every in-flight transfer holds its pins and can still be acked (the engine has it); every
        pin held for a transfer belongs to such a transfer; load-back marks name live transfers."""
        pending = self.engine.pending
        owners: dict = {}  # (component index, tier) -> slot -> owning node (``_slot_owners``)
        for tid, t in self.transfers.items():
            for rid in t.receipts:
                if rid not in self.locks:
                    v.append(("transfer.unpinned", t.anchor, f"transfer {tid} lost its lock {rid}"))
            if tid not in pending:
                v.append(("transfer.unackable", t.anchor, f"transfer {tid} is in flight but not "
                          "queued: no poll can ack it"))
            self._check_transfer_slots(t, v, owners)
        for tid in pending:
            if tid not in self.transfers:
                t = getattr(pending[tid], "transfer", None)
                v.append(("transfer.orphan_queued", getattr(t, "anchor", None),
                          f"{getattr(t, 'kind', 'transfer')} {tid} queued but not in flight: "
                          "it was acked before its copy ran"))
        for rid, entry in self.locks.items():
            owner = entry.owner
            if not (isinstance(owner, str) and owner.startswith("transfer:")):
                continue
            tid = int(owner.split(":", 1)[1])
            t = self.transfers.get(tid)
            if t is None or tid not in pending or rid not in t.receipts:
                v.append(("transfer.stranded_pin", entry.anchor, f"lock {rid} is held for transfer "
                          f"{tid}, which can no longer be acked"))
        for nid, tids in self.loading.items():
            dead = [t for t in tids if t not in self.transfers]
            if dead or nid not in self.tree.nodes:
                v.append(("transfer.loading_mark", nid, f"marked as loading by transfers {list(tids)}"
                          f"; not in flight: {dead}"))

    def _check_transfer_slots(self, t, v: list, owners: dict) -> None:
        """Every slot an in-flight transfer reads or writes is allocated, and no node outside the
        transfer holds it: a freed one, or one freed and taken again by another node, means a
        copy runs on memory another owner may already hold (use after free)."""
        mine = {t.anchor, *self.transfer_nodes.get(t.transfer_id, t.node_ids)}
        for cp in t.copies:
            ci = self.ci[cp.component]
            for tier_label, idx in ((cp.src_tier, cp.src), (cp.dst_tier, cp.dst)):
                tier = Tier.of(tier_label)
                pool = self.pools[ci][tier]
                if pool is None:  # storage: the destination of a store holds no slots
                    continue
                alloc = pool.alloc
                slots = idx.tolist()
                freed = sorted({s for s in slots if not alloc.is_used(s // alloc.page_size)})
                held = self._slot_owners(ci, tier, owners)
                taken = sorted({(s, o) for s in slots if (o := held.get(s)) is not None and o not in mine})
                what = f"{t.kind} {t.transfer_id} still {'reads' if idx is cp.src else 'writes'}"
                if freed:
                    v.append(("transfer.slot_freed", t.anchor,
                              f"{what} {cp.component}/{tier_label} slots {freed[:8]}, which are free"))
                if taken:
                    v.append(("transfer.slot_freed", t.anchor,
                              f"{what} {cp.component}/{tier_label} slots "
                              f"{[s for s, _ in taken][:8]}, freed and taken again by node(s) "
                              f"{sorted({n for _, n in taken})[:8]}"))

    def _slot_owners(self, ci: int, tier, memo: dict) -> dict[int, int]:
        """slot -> the node whose value holds it, for one component and tier (built once per
        ``check`` and only when a transfer is in flight)."""
        key = (ci, int(tier))
        if key not in memo:
            memo[key] = {s: nid for nid, node in self.tree.nodes.items()
                         if (val := node.data[ci].values[tier]) is not None
                         for s in val.tolist()}
        return memo[key]

    def _check_pool(self, comp, tier: int, values: list[torch.Tensor], v: list) -> None:
        ci = comp.index
        alloc = self.pool(ci, tier).alloc
        tn = TIER_LABELS[tier]
        held = self.request_held[ci][tier]
        if alloc.available != alloc._top * alloc.page_size:  # kept beside the free stack's top
            v.append((f"{comp.name}.{tn}.available", None,
                      f"available {alloc.available} != {alloc._top} free pages x page size "
                      f"{alloc.page_size}"))
        total = alloc.available + self.evictable[ci][tier] + self.protected[ci][tier] + held
        if total != alloc.capacity:
            v.append((f"{comp.name}.{tn}.conservation", None,
                      f"free {alloc.available} + evictable {self.evictable[ci][tier]} + protected "
                      f"{self.protected[ci][tier]} + held by requests {held} = {total} != capacity "
                      f"{alloc.capacity}"))
        if values:
            idx = torch.cat([val for _, val in values])
            if idx.numel() and torch.unique(idx).numel() != idx.numel():
                seen: dict[int, int] = {}
                for nid, val in values:
                    for s in val.tolist():
                        if s in seen:
                            v.append((f"{comp.name}.{tn}.slot_shared", nid,
                                      f"slot {s} is also owned by node {seen[s]}"))
                            break
                        seen[s] = nid
            for nid, val in values:
                pages = (val // alloc.page_size).tolist()
                freed = [q * alloc.page_size for q in pages if not alloc.is_used(q)]
                if freed:
                    v.append((f"{comp.name}.{tn}.slot_freed", nid, f"holds freed slots {freed[:8]}"))
        if tier == DEVICE:  # the tree-ownership marks (what free / insert trust) equal a recount
            held = {s // alloc.page_size for _, val in values for s in val.tolist()}
            marked = alloc.tree_pages()
            if held != marked:
                v.append((f"{comp.name}.{tn}.tree_marks", None,
                          f"pages held by nodes but unmarked {sorted(held - marked)[:8]}, marked "
                          f"but held by no node {sorted(marked - held)[:8]}"))

    def _live_snapshot(self) -> CacheSnapshot:
        comps = self.comps
        out = []
        for nid in sorted(self.tree.nodes):
            n = self.tree.nodes[nid]
            states = []
            for comp in comps:
                d = n.data[comp.index]
                states.append(ComponentState(
                    tuple(None if x is None else comp.size(x) for x in d.values), tuple(d.refs)))
            out.append(NodeSnapshot(nid, None if n.parent is None else n.parent.id, n.extra_key,
                                    tuple(n.key), n.last_access, n.hit_count, tuple(states)))
        in_flight = {}
        every = {**self.transfers, **self.store_transfers}
        for t in every.values():
            for c, a in t.amounts():
                key = (c, t.dst_tier)
                in_flight[key] = in_flight.get(key, 0) + a
        pools = tuple(
            PoolSnapshot(comp.name, tier.label, self.pool(comp.index, tier).alloc.capacity,
                         self.pool(comp.index, tier).alloc.available, self.evictable[comp.index][tier],
                         self.protected[comp.index][tier], in_flight.get((comp.name, tier.label), 0))
            for comp in comps for tier in self.pool_tiers)
        locks = tuple(
            LockSnapshot(e.receipt_id, e.owner, e.anchor, TIER_LABELS[e.tier],
                         tuple((comps[ci].name, tuple(ids)) for ci, ids in sorted(e.pins.items())))
            for _, e in sorted(self.locks.items()))
        transfers = tuple(
            TransferSnapshot(tid, t.kind, t.anchor, t.dst_tier, tuple(self.transfer_nodes[tid]),
                             t.amounts())
            for tid, t in sorted(every.items()))
        return CacheSnapshot(self.seq, self.page_size, tuple(c.name for c in comps), tuple(out),
                             pools, locks, transfers)


__all__ = ["Invariants", "ev"]
