"""Pins: the lock table's primitives, ``acquire`` and ``release`` (a mixin of ``CacheCore``).

A lock pins nodes per component on one tier (``lock_ref`` on DEVICE, ``host_ref`` on HOST),
moves their slots from the evictable to the protected ledger, re-files the nodes whose leaf
status changed, and records ``lock.acquire`` / ``lock.release``. ``LockEntry`` is what the lock
table keeps; ``unlock`` replays it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixscope.cache import events as ev
from radixscope.cache.tiers import DEVICE, TIER_LABELS

if TYPE_CHECKING:
    from radixscope.cache.tree import Node


class LockEntry:
    """A live lock: the nodes pinned per component index (bottom-up order). ``named``: the pins
    as records and receipts name them (``((component, (node ids)), ...)``), kept while
    ``pins`` is unchanged (a split or a partial release sets it to None)."""

    __slots__ = ("receipt_id", "owner", "anchor", "tier", "pins", "named")

    def __init__(self, receipt_id: int, owner: str | None, anchor: int, tier: int,
                 pins: dict[int, list[int]]) -> None:
        self.receipt_id = receipt_id
        self.owner = owner
        self.anchor = anchor
        self.tier = tier
        self.pins = pins
        self.named: tuple | None = None


class Pins:
    """``acquire`` / ``release`` over ``CacheCore``'s lock table, ledgers and leaf sets."""

    def acquire(self, anchor: Node, tier: int, pins: dict[int, list[Node]], owner) -> int:
        """Pin nodes (lock_ref on device, host_ref on host) and register the lock."""
        rid = self._next_receipt
        self._next_receipt += 1
        first: list[Node] = []  # nodes that went from unpinned to pinned on this tier
        held: dict[int, list[int]] = {}  # the entry's pinned ids per component, in order
        for ci in sorted(pins):
            nodes = pins[ci]
            if not nodes:
                continue
            size = self._sizes[ci]
            moved = 0  # slots going from evictable to protected
            ids = held[ci] = []
            for node in nodes:
                ids.append(node.id)
                d = node.data[ci]
                refs = d.refs
                if not refs[tier]:
                    first.append(node)
                    v = d.values[tier]
                    if v is not None:
                        moved += size(v)
                refs[tier] += 1
            if moved:
                self.evictable[ci][tier] -= moved
                self.protected[ci][tier] += moved
        entry = LockEntry(rid, owner, anchor.id, tier, held)
        self.locks[rid] = entry
        for node in first:  # (a node pinned by two components is refreshed twice: idempotent)
            # a node with FULL on device under a device child is never a leaf: skip the call
            if not node.device_children or node.data[0].values[DEVICE] is None:
                self.refresh_leaf(node)
        if self._on:
            self._ledger.m(ev.LOCK_ACQUIRE, anchor.id, None, TIER_LABELS[tier],
                    (rid, owner, self.named_pins(entry)))
        return rid

    def named_pins(self, entry: LockEntry) -> tuple:
        """``entry``'s pins as records and receipts name them (built once while unchanged)."""
        out = entry.named
        if out is None:
            out = entry.named = self._pins_out(entry)
        return out

    def _pins_out(self, entry: LockEntry, cis=None) -> tuple:
        # entry.pins is in component order (built from sorted pins; releases only delete)
        comps = self.comps
        return tuple([(comps[ci].name, tuple(ids)) for ci, ids in entry.pins.items()
                      if cis is None or ci in cis])

    def release(self, entry: LockEntry, cis: set[int] | None = None) -> LockEntry:
        """Unpin ``entry``'s nodes; with ``cis``, only those components (a partial release that
        keeps the lock live), otherwise all of them, retiring the lock. Returns ``entry``: the
        result ``unlock``'s and ``release_swa``'s attributes are read from (``op_attrs``)."""
        nodes = self.tree.nodes
        out = None
        if self._on:
            out = self.named_pins(entry) if cis is None else self._pins_out(entry, cis)
        touched: list[Node] = []  # nodes left unpinned on this tier (refreshed: idempotent)
        tier = entry.tier
        for ci, ids in entry.pins.items():  # in component order (``acquire``)
            if cis is not None and ci not in cis:
                continue
            size = self._sizes[ci]
            moved = 0  # slots going from protected to evictable
            for nid in ids:
                node = nodes[nid]
                d = node.data[ci]
                refs = d.refs
                refs[tier] -= 1
                if not refs[tier]:
                    touched.append(node)
                    v = d.values[tier]
                    if v is not None:
                        moved += size(v)
            if moved:
                self.protected[ci][tier] -= moved
                self.evictable[ci][tier] += moved
        for ci in list(entry.pins):
            if cis is None or ci in cis:
                del entry.pins[ci]
        entry.named = None
        final = cis is None
        if final:
            del self.locks[entry.receipt_id]
        for node in touched:
            if not node.device_children or node.data[0].values[DEVICE] is None:
                self.refresh_leaf(node)
        if self._on:
            self._ledger.m(ev.LOCK_RELEASE, entry.anchor, None, TIER_LABELS[entry.tier],
                    (entry.receipt_id, out, final))
        return entry


__all__ = ["LockEntry", "Pins"]
