"""``check()``'s storage rules, as a mixin of ``HiRadixCache`` (run only with a storage tier).

STORAGE values are ``StoredPages`` of the node's pages, chained from the parent (the first
page's link is recomputed: one hash per node), FULL prefix-closed, auxiliary only with FULL; no
pins on STORAGE; the storage ledgers equal the sum; every ``store:`` pin belongs to a live store
and every store holds its pins; the prefetch controller's own ``check()``; the host slots
prefetches hold equal the request-held host ledger; every running prefetch holds its anchor pin
and no ``prefetch:`` pin outlives its prefetch. Read-only.
"""

from __future__ import annotations

from radixscope.cache.errors import InvariantViolation
from radixscope.cache.l3_prefetch import PREFETCH_OWNER
from radixscope.cache.l3_writes import STORE_OWNER, namespace_of
from radixscope.cache.state import CacheCore
from radixscope.cache.storage.keys import page_hashes
from radixscope.cache.storage.stored import StoredPages
from radixscope.cache.tiers import HOST, STORAGE


class StorageInvariants(CacheCore):
    """The storage part of ``check()``: methods of ``HiRadixCache``."""

    def _check_storage(self, v: list) -> None:
        """Storage rules: STORAGE values are StoredPages of the node's pages, chained from the
        parent, FULL prefix-closed, auxiliary only with FULL; no pins or pool on STORAGE;
        ledgers equal the sum; store pins belong to live store transfers; the prefetch's."""
        ps = self.page_size
        sums = [0] * len(self.comps)
        for n in self.tree.nodes.values():
            if n.parent is None:
                continue
            f = n.data[0].values[STORAGE]
            for comp in self.comps:
                d = n.data[comp.index]
                val = d.values[STORAGE]
                if d.refs[STORAGE]:
                    v.append((f"{comp.name}.storage_ref", n.id, f"{d.refs[STORAGE]} pins"))
                if val is None:
                    continue
                want = 1 if comp.boundary_state else len(n.key)
                if not isinstance(val, StoredPages) or val.numel() != want or \
                        val.state != comp.boundary_state:
                    v.append((f"{comp.name}.storage_value", n.id, f"{val!r} for {want} slots"))
                    continue
                sums[comp.index] += val.numel()
                if comp.index and f is None:
                    v.append((f"{comp.name}.storage_without_full", n.id, "no FULL STORAGE"))
            if f is None or not isinstance(f, StoredPages):
                continue
            par = n.parent
            if par.parent is not None and par.data[0].values[STORAGE] is None:
                v.append(("full.storage_prefix_closed", n.id, f"parent {par.id} not stored"))
                continue
            # the chain link: the first page continues from the parent's last hash (one hash
            # per node keeps check() O(nodes); values are sliced from chains built from keys)
            prior = None if par.parent is None else par.data[0].values[STORAGE].last
            want_h = page_hashes(list(n.key[:ps]), ps, prior=prior,
                                 extra_key=None if prior else namespace_of(n.extra_key))
            if want_h[0] != f.hashes[0]:
                v.append(("full.storage_hashes", n.id, "first page does not chain from the "
                          f"parent {par.id}'s last page"))
            for comp in self.comps[1:]:
                val = n.data[comp.index].values[STORAGE]
                if isinstance(val, StoredPages) and val.hashes != (
                        f.hashes[-1:] if comp.boundary_state else f.hashes):
                    v.append((f"{comp.name}.storage_hashes", n.id, "not the node's pages"))
        for comp in self.comps:
            ci = comp.index
            if self.evictable[ci][STORAGE] != sums[ci] or self.protected[ci][STORAGE]:
                v.append((f"{comp.name}.storage.ledger", None,
                          f"evictable {self.evictable[ci][STORAGE]} protected "
                          f"{self.protected[ci][STORAGE]}, recount {sums[ci]}"))
        owners: dict = {}  # ``_check_transfer_slots``' slot owners, built once
        for tid, t in self.store_transfers.items():
            if any(r not in self.locks for r in t.receipts):
                v.append(("store.unpinned", t.anchor, f"store {tid} lost its host pins"))
            # the writer thread reads these host slots until the ack: they must stay allocated
            # and stay the pinned nodes' host copies, or L3 gets another owner's bytes under a
            # valid checksum (a use after free no reader of the shared store can detect)
            self._check_transfer_slots(t, v, owners)
            for rid in t.receipts:
                entry = self.locks.get(rid)
                for ci, ids in (entry.pins.items() if entry is not None else ()):
                    gone = [i for i in ids if i not in self.tree.nodes
                            or self.tree.nodes[i].data[ci].values[HOST] is None]
                    if gone:
                        v.append(("store.value_gone", gone[0], f"store {tid} still reads the "
                                  f"{self.comps[ci].name} host copies of nodes {gone[:8]}, "
                                  "which are gone"))
        for rid, e in self.locks.items():
            if isinstance(e.owner, str) and e.owner.startswith(STORE_OWNER):
                t = self.store_transfers.get(int(e.owner[len(STORE_OWNER):]))
                if t is None or rid not in t.receipts:
                    v.append(("store.stranded_pin", e.anchor, f"lock {rid} held for {e.owner}"))
        self._check_prefetch(v)

    def _check_prefetch(self, v: list) -> None:
        try:
            self.prefetcher.check()
        except InvariantViolation as e:
            v.extend(e.violations)
        held = {c.name: 0 for c in self.comps}
        for op in self.prefetcher._live():
            for key, slots in op.held().items():
                name = self.comps[0].name if key.startswith("__") else key
                held[name] += slots.numel()
        for c in self.comps:
            if held[c.name] != self.request_held[c.index][HOST]:
                v.append((f"{c.name}.host.prefetch_held", None,
                          f"prefetches hold {held[c.name]} host slots, ledger "
                          f"{self.request_held[c.index][HOST]}"))
        for req_id, run in self._pf.items():
            if not self.prefetcher.ongoing(req_id):
                v.append(("prefetch.stranded", run.anchor, f"{req_id} not running in the "
                          "controller"))
            if run.receipt is not None and run.receipt not in self.locks:
                v.append(("prefetch.unpinned", run.anchor, f"{req_id} lost its anchor pin"))
        for rid, e in self.locks.items():
            if isinstance(e.owner, str) and e.owner.startswith(PREFETCH_OWNER):
                run = self._pf.get(e.owner[len(PREFETCH_OWNER):])
                if run is None or run.receipt != rid:
                    v.append(("prefetch.leaked_pin", e.anchor, f"lock {rid} held for "
                              f"{e.owner}, which is not running"))



__all__ = ["StorageInvariants"]
