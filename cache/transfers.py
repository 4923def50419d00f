"""Device <-> host transfers: backup (device -> host) and load-back (host -> device).

A transfer is a frozen ``Transfer`` listing ``PoolCopy`` jobs; the tree's own index tensors are
cloned into the nodes, so nothing the transfer holds is shared with the tree (seed bug class 4).
Host values (backup) or device values (load-back) are set when the transfer is created; the
nodes involved stay pinned (device lock + host ref) until ``poll`` acks the copy.

Under CUDA the copies run on a side stream fenced behind the current stream, one DMA per run of
slots between the device pool and the pinned host pool, or staged through pinned memory when the
runs are tiny (``transfer_engine``), and an event marks completion. On CPU a transfer runs when
``poll`` asks for it, in the order asked, so tests choose the completion order.
"""

from __future__ import annotations

import time

import torch

from radixscope.cache import events as ev
from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.cache.errors import StaleHandle
from radixscope.cache.results import LoadBackResult, PoolCopy, Transfer, TransferId
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import DEVICE, HOST, TIER_LABELS
from radixscope.cache.tree import Node


class Transfers(CacheCore):
    """Backup and load-back transfers and their acks: methods of ``HiRadixCache``."""

    def _make_ready_nodes(self, nodes) -> None:
        """Make every in-flight load-back writing device data of ``nodes`` readable (see
        ``TransferEngine.make_ready``). O(len(nodes)); nothing to do when no load-back is in flight."""
        loading = self.loading
        if not loading:
            return
        tids: set[int] = set()
        for n in nodes:
            got = loading.get(n.id)
            if got:
                tids.update(got)
        for tid in sorted(tids):
            self.engine.make_ready(self, tid)

    def _register_transfer(self, t: Transfer) -> None:
        self.transfers[t.transfer_id] = t
        self.transfer_nodes[t.transfer_id] = list(t.node_ids)
        if t.kind == "load_back":
            loading = self.loading
            for nid in t.node_ids:
                loading[nid] = loading.get(nid, ()) + (t.transfer_id,)
        self._ledger.m(ev.TRANSFER_START, t.anchor, None, t.dst_tier,
                (t.transfer_id, t.kind, t.node_ids, t.amounts()))
        self.engine.submit(self, t)

    def _next_tid(self) -> int:
        tid = self._next_transfer
        self._next_transfer += 1
        return tid

    def _backup(self, node: Node, cis: set[int] | None = None) -> int | None:
        """Start a device -> host copy of ``node`` (and, under write-through, its unbacked ancestors,
        root-first, so host copies stay prefix-closed). ``cis`` limits the copy to those components
        (write_back saving auxiliary data it is about to tombstone). Returns the transfer id or
        None."""
        write_through = self.config.write_policy != "write_back"
        chain: list[tuple[Node, list[int]]] = []
        cur = node
        while cur.parent is not None:
            needs = [ci for ci, d in enumerate(cur.data) if d.values[DEVICE] is not None and d.values[HOST] is None
                     and (cis is None or ci in cis)]
            if not needs:
                break
            chain.append((cur, needs))
            if not write_through:
                break
            cur = cur.parent
        if not chain:
            return None
        chain.reverse()
        nodes = [n for n, _ in chain]
        tid = self._next_tid()
        owner = f"transfer:{tid}"
        # pin first, so making host room below cannot delete (or demote) what we are copying.
        # FULL pins the whole path to the root, like any lock: an ancestor of a pinned node can
        # never be a leaf, so counting it as evictable would let admission over-promise
        dev_pins: dict[int, list[Node]] = {0: self.tree.path_to_root(node)}
        host_pins: dict[int, list[Node]] = {}
        for comp in self.comps:
            with_ci = [n for n, needs in chain if comp.index in needs]
            if with_ci:
                host_pins[comp.index] = with_ci
                if comp.index:
                    dev_pins[comp.index] = with_ci
        r1 = self.acquire(node, DEVICE, dev_pins, owner)
        r2 = self.acquire(node, HOST, host_pins, owner)
        host: dict[int, torch.Tensor] = {}
        for ci, with_ci in host_pins.items():
            amount = sum(self.comps[ci].size(n.data[ci].values[DEVICE]) for n in with_ci)
            got = self.take_slots(ci, HOST, amount)
            if got is None:
                self._evict_host_slots(ci, amount - self.pool(ci, HOST).alloc.available)
                got = self.take_slots(ci, HOST, amount)
            if got is None:
                for cj, idx in host.items():
                    self.free_slots(cj, HOST, idx)
                self.release(self.locks[r2])
                self.release(self.locks[r1])
                return None
            host[ci] = got
        copies = [self._place_copy(ci, host_pins[ci], DEVICE, HOST, dst)
                  for ci, dst in host.items()]
        t = Transfer(tid, "backup", node.id, tuple(n.id for n in nodes), tuple(copies),
                     self.current_op_id, (r1, r2), time.time_ns())
        self._register_transfer(t)
        return tid

    def _backup_after_insert(self, node: Node) -> tuple[int, ...]:
        """Insert-time backups per write policy (none under write_back)."""
        cfg = self.config
        if not cfg.has_host or cfg.write_policy == "write_back":
            return ()
        if cfg.write_policy == "write_through_selective":
            while node.parent is not None and node.hit_count < cfg.write_through_threshold:
                node = node.parent
            if node.parent is None:
                return ()
        tid = self._backup(node)
        return () if tid is None else (tid,)

    def _backup_sync(self, node: Node, cis: set[int] | None = None) -> bool:
        """Write-back: back ``node`` up (only ``cis`` when given) and wait for the copy (used right
        before demoting it, or before tombstoning its auxiliary data)."""
        tid = self._backup(node, cis)
        if tid is None:
            return False
        self._poll([tid], wait=True)
        return True

    def _load_back(self, anchor: Node, cow_mamba: bool) -> LoadBackResult:
        tree = self.tree
        path = tree.path_to_root(anchor)
        self._validate_anchor(anchor, path)
        si, mi = self.ci.get(WINDOW), self.ci.get(STATE)
        plans: dict[int, list[Node]] = {}
        cut = None
        for comp in self.comps:
            nodes, c = comp.load_plan(path)
            plans[comp.index] = nodes
            if c is not None:
                cut = (nodes[-1], c)
        amounts = {ci: sum(self.comps[ci].size(n.data[ci].values[HOST]) for n in ns)
                   for ci, ns in plans.items() if ns}
        if cut is not None:
            amounts[si] -= len(cut[0].key) - cut[1]  # only the in-window pages load
        want_cow = cow_mamba and mi is not None and anchor.parent is not None
        thresh = self.config.load_back_threshold
        if not amounts or (set(amounts) == {0} and amounts[0] < thresh):
            slot = self._cow_now(anchor, mi) if want_cow else None
            return self._load_result(anchor, {}, None, slot)
        if want_cow and mi not in amounts and anchor.data[mi].values[DEVICE] is None:
            want_cow = False  # no state to copy on either tier
        need = dict(amounts)
        if want_cow:
            need[mi] = need.get(mi, 0) + 1
        self._check_room(anchor, need)  # raises with nothing changed
        if cut is not None:
            self.split(cut[0], len(cut[0].key) - cut[1])  # keep only in-window pages
            path = tree.path_to_root(anchor)
            plans[0] = self.comps[0].load_plan(path)[0]  # the cut-off top is part of FULL's segment
        tid = self._next_tid()
        owner = f"transfer:{tid}"
        pins, _skipped = self.lock_pins(anchor)
        tmp = self.acquire(anchor, DEVICE, pins, "load_back")
        # host-pin the sources before allocating: eviction (a write-back backup looking for host
        # room) must not reclaim the very nodes we are about to load
        r2 = self.acquire(anchor, HOST, {ci: ns for ci, ns in plans.items() if ci in amounts}, owner)
        try:
            slots = self._alloc_all(amounts, mi if want_cow else None)
        except BaseException:
            self.release(self.locks[r2])
            raise
        finally:
            self.release(self.locks[tmp])
        cow_slot = slots.pop(-1, None)
        copies = []
        for ci, ns in plans.items():
            if ci in slots:
                copies.append(self._place_copy(ci, ns[::-1], HOST, DEVICE, slots[ci]))
        if cow_slot is not None:
            state = anchor.data[mi]
            if mi not in slots:  # copying the device state: an earlier load-back may still write it
                self._make_ready_nodes([anchor])
            src = state.values[HOST] if mi in slots else state.values[DEVICE]
            copies.append(PoolCopy(STATE, ev.TIER_HOST if mi in slots else ev.TIER_DEVICE,
                                   ev.TIER_DEVICE, src.clone(), cow_slot.clone()))
        dev_pins, _ = self.lock_pins(anchor)
        r1 = self.acquire(anchor, DEVICE, dev_pins, owner)
        loaded_nodes = sorted({n.id for ns in plans.values() for n in ns})
        t = Transfer(tid, "load_back", anchor.id, tuple(loaded_nodes), tuple(copies),
                     self.current_op_id, (r1, r2), time.time_ns())
        self._register_transfer(t)
        if cow_slot is not None:
            self.cow_pending[int(cow_slot[0])] = tid
        return self._load_result(anchor, amounts, tid, cow_slot)

    def _place_copy(self, ci: int, nodes: list[Node], src: int, dst: int,
                    slots: torch.Tensor) -> PoolCopy:
        """Give ``nodes`` (root-first) consecutive runs of ``slots`` as their ``dst``-tier
        values of component ``ci`` (clones: the transfer shares no tensor with the tree), and
        return the copy of their ``src``-tier values into them."""
        size = self.comps[ci].size
        srcs, off = [], 0
        for n in nodes:
            v = n.data[ci].values[src]
            k = size(v)
            self.set_value(n, ci, dst, slots[off:off + k].clone())
            srcs.append(v)
            off += k
        return PoolCopy(self.comps[ci].name, TIER_LABELS[src], TIER_LABELS[dst], torch.cat(srcs),
                        slots.clone())

    def _validate_anchor(self, anchor: Node, path: list[Node]) -> None:
        """The anchor must be accepted on device or host by every component (seed bug class 1)."""
        if anchor.parent is None:
            return
        vals = [c.validator(True) for c in self.comps]
        ok = [True] * len(vals)
        for n in reversed(path):
            ok = [v(n) for v in vals]
        bad = [self.comps[i].name for i, good in enumerate(ok) if not good]
        if bad:
            err = StaleHandle(f"load-back anchor node {anchor.id} is not accepted by component(s) "
                              f"{bad}: the match is stale; match again")
            err.rule, err.nodes = "load_back.anchor_accepted", (anchor.id,)
            raise err

    def _check_room(self, anchor: Node, need: dict[int, int]) -> None:
        """Raise CacheOutOfMemory unless every component can make room with the anchor's own path
        pinned (the same arithmetic as admission), before anything is changed."""
        pins, _ = self.lock_pins(anchor)
        for ci, amt in need.items():
            size = self.comps[ci].size
            own = sum(size(n.data[ci].values[DEVICE]) for n in pins.get(ci, ())
                      if n.data[ci].values[DEVICE] is not None and n.data[ci].refs[DEVICE] == 0)
            alloc = self.device_pools[ci].alloc
            if alloc.available + self.evictable[ci][DEVICE] - own < amt:
                raise self.oom(ci, DEVICE, amt, f"load-back; {own} evictable slots are on the "
                               "anchor's own path")

    def _alloc_all(self, amounts: dict[int, int], cow_ci) -> dict[int, torch.Tensor]:
        """Allocate every component's device slots or raise before evicting anything."""
        need = dict(amounts)
        if cow_ci is not None:
            need[cow_ci] = need.get(cow_ci, 0) + 1
        for ci, amt in need.items():
            alloc = self.device_pools[ci].alloc
            if alloc.available + self.evictable[ci][DEVICE] < amt:
                raise self.oom(ci, DEVICE, amt, "load-back")
        out: dict[int, torch.Tensor] = {}
        try:
            for ci, amt in need.items():
                alloc = self.device_pools[ci].alloc
                if alloc.available < amt:
                    self._evict_device(ci, amt - alloc.available)
                got = self.take_slots(ci, DEVICE, amt)
                if got is None:
                    raise self.oom(ci, DEVICE, amt, "load-back: eviction fell short")
                out[ci] = got
        except BaseException:
            for ci, got in out.items():
                self.free_slots(ci, DEVICE, got)
            raise
        if cow_ci is not None:
            both = out[cow_ci]
            out[-1] = both[-1:]
            if both.numel() > 1:
                out[cow_ci] = both[:-1]
            else:
                del out[cow_ci]
            self.request_held[cow_ci][DEVICE] += 1
        return out

    def _cow_now(self, anchor: Node, mi: int) -> torch.Tensor | None:
        if anchor.data[mi].values[DEVICE] is None:
            return None
        self._make_ready_nodes([anchor])  # the state may come from a load-back still in flight
        return self._cow_mamba(anchor)

    def _load_result(self, anchor: Node, amounts: dict[int, int], tid, cow_slot
                ) -> LoadBackResult:
        path = self.tree.path_to_root(anchor)[::-1]
        vals = [n.data[0].values[DEVICE] for n in path]
        if any(v is None for v in vals):
            idx = torch.empty(0, dtype=torch.int64)
            k = 0
            while k < len(vals) and vals[k] is not None:
                k += 1
            vals = vals[:k]
        idx = torch.cat(vals) if vals else torch.empty(0, dtype=torch.int64)
        loaded = tuple((c.name, amounts.get(c.index, 0)) for c in self.comps)
        return LoadBackResult(anchor.id, idx, idx.numel(), loaded,
                              None if tid is None else TransferId(tid, self.instance), cow_slot,
                              self.instance)

    def _poll(self, ids: list[int] | None, wait: bool) -> list[int]:
        out = []
        for t, started, nbytes, copy_ns in self.engine.collect(self, ids, wait):
            self._ack(t, started, nbytes, copy_ns)
            out.append(t.transfer_id)
        return out

    def _ack(self, t: Transfer, started: int, nbytes: int, copy_ns: int | None = None) -> None:
        tok = self._begin()
        for rid in t.receipts:
            self.release(self.locks[rid])
        del self.transfers[t.transfer_id]
        covered = self.transfer_nodes.pop(t.transfer_id, ())
        if t.kind == "load_back":
            for slot in [s for s, x in self.cow_pending.items() if x == t.transfer_id]:
                del self.cow_pending[slot]
            loading = self.loading
            for nid in covered:
                left = tuple(x for x in loading.get(nid, ()) if x != t.transfer_id)
                if left:
                    loading[nid] = left
                else:
                    loading.pop(nid, None)
        self._ledger.m(ev.TRANSFER_DONE, t.anchor, None, t.dst_tier, (t.transfer_id, True))
        if self.storage is not None and t.kind == "backup" and t.anchor in self.tree.nodes:
            self._store_after_backup(self.tree.nodes[t.anchor])  # L3 write-through
        attrs = {ev.A_TRANSFER: t.transfer_id, ev.A_TRANSFER_KIND: t.kind, ev.A_NODE: t.anchor,
                 ev.A_ENQUEUED_BY: t.enqueued_by, ev.A_BYTES: nbytes,
                 ev.A_TOKENS: dict(t.amounts()).get(BACKBONE, 0), ev.A_FREED: dict(t.amounts()),
                 ev.A_NODES: len(t.node_ids)}
        if copy_ns is not None:  # CUDA: the copies' own time on the side stream
            attrs[ev.A_COPY_NS] = copy_ns
        self.end_transfer(tok, attrs, started or t.created_ns)


__all__ = ["Transfers"]
