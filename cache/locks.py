"""Locks: ``lock``, ``unlock`` and ``release_swa`` over the cache's lock table (receipts that
unlock replays). A mixin of ``HiRadixCache``."""

from __future__ import annotations

import dataclasses

from radixscope.cache import events as ev
from radixscope.cache.components import WINDOW
from radixscope.cache.pins import LockEntry
from radixscope.cache.results import LockReceipt
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import DEVICE
from radixscope.cache.tree import Node


class Locks(CacheCore):
    """Pin a node's prefix per component; every lock is released with its receipt."""

    def lock(self, node: int, *, owner: str | None = None, req_id: str | None = None
             ) -> LockReceipt:
        """Pin ``node`` against eviction. FULL pins the device path to the root and skips (and
        records in ``receipt.skipped``) an evicted bottom segment; SWA pins one window; MAMBA
        the anchor. Returns the receipt ``unlock`` needs. Mutates: lock refs, ledgers
        (evictable -> protected), evictable-leaf sets. Emits: ``lock`` op, ``lock.acquire``."""
        n = self.node(node)
        if owner is not None and not isinstance(owner, str):
            raise TypeError(f"owner must be a str or None, got {owner!r}")
        return self._ledger.run(ev.OP_LOCK, req_id, self._lock, n,
                                owner if owner is not None else req_id)

    def lock_pins(self, n: Node) -> tuple[dict[int, list[Node]], list[Node]]:
        path = self.tree.path_to_root(n)
        k = 0
        while k < len(path) and path[k].data[0].values[DEVICE] is None:
            k += 1
        eff = path[k:]
        return {c.index: c.lock_pins(eff) for c in self.comps}, path[:k]

    def _lock(self, n: Node, owner) -> LockReceipt:
        pins, skipped = self.lock_pins(n)
        rid = self.acquire(n, DEVICE, pins, owner)
        # the lock entry holds the pinned ids per component, in component order
        return LockReceipt(rid, n.id, owner, ev.TIER_DEVICE, self.named_pins(self.locks[rid]),
                           tuple([x.id for x in skipped]), False, self.instance)

    def _entry_of(self, receipt) -> LockEntry:
        if not isinstance(receipt, LockReceipt):
            raise TypeError(f"expected a LockReceipt, got {type(receipt).__name__}")
        entry = self.locks.get(receipt.receipt_id)
        if receipt.cache_instance != self.instance:
            raise ValueError(f"receipt {receipt.receipt_id} belongs to another cache instance")
        if entry is None:
            raise ValueError(f"receipt {receipt.receipt_id} (anchor {receipt.anchor}) is not "
                             "live: already unlocked")
        if entry.anchor != receipt.anchor or entry.owner != receipt.owner:
            raise ValueError(f"receipt {receipt.receipt_id} does not match the live lock "
                             f"(anchor {entry.anchor}, owner {entry.owner!r})")
        return entry

    def unlock(self, receipt: LockReceipt, *, req_id: str | None = None) -> None:
        """Release a lock. A double unlock or a foreign receipt raises ValueError.
        Mutates: lock refs, ledgers, leaf sets. Emits: ``unlock`` op, ``lock.release``."""
        entry = self._entry_of(receipt)
        self._ledger.run(ev.OP_UNLOCK, req_id, self.release, entry)

    def release_swa(self, receipt: LockReceipt, *, req_id: str | None = None) -> LockReceipt:
        """Release a lock's SWA window (and its lower-priority MAMBA pin) early, once decode has
        moved past the window. Returns a new receipt; ``unlock`` it later as usual."""
        if WINDOW not in self.ci:
            raise ValueError(f"release_swa needs the {WINDOW!r} component")
        entry = self._entry_of(receipt)
        if receipt.swa_released:
            raise ValueError(f"receipt {receipt.receipt_id}: SWA window already released")
        pri = self.comps[self.ci[WINDOW]].priority
        cis = {c.index for c in self.comps if c.priority <= pri}
        self._ledger.run(ev.OP_RELEASE_SWA, req_id, self.release, entry, cis)
        return dataclasses.replace(receipt, swa_released=True)

    def locks_owned_by(self, owner: str) -> tuple[int, ...]:
        """Receipt ids of the live locks ``owner`` holds (read-only, O(live locks)): a request
        that ended must hold none."""
        return tuple(rid for rid, e in self.locks.items() if e.owner == owner)
