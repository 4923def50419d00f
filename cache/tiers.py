"""The memory tiers, as data: one enum, and the only place that knows how many there are.

``Tier`` indexes every per-tier list in the cache (a component's values and refs on a node, the
evictable / protected ledgers, the evictable-leaf sets and heaps, the recency lists, the pools).
Records name a tier by its ``label`` (``"device"``, ``"host"``, ``"storage"``). STORAGE (L3)
has no pool: a node's STORAGE value is a ``storage.stored.StoredPages`` (the chained hashes of
its pages in L3), set only with a storage tier attached; ``RESIDENT`` are the tiers with pools.
"""

from __future__ import annotations

from enum import IntEnum


class Tier(IntEnum):
    DEVICE = 0   # GPU memory (CPU without one): L1
    HOST = 1     # pinned host memory: L2
    STORAGE = 2  # L3 storage backends: no pool (values are page hashes)

    @property
    def label(self) -> str:
        """The name records, snapshots and the store use for this tier."""
        return _LABELS[self]

    @property
    def ref_name(self) -> str:
        """What a pin on this tier is called (``lock_ref`` on DEVICE, ``host_ref`` on HOST)."""
        return _REF_NAMES[self]

    @classmethod
    def of(cls, label: str) -> Tier:
        """The tier a record names; ValueError naming the label and the known ones."""
        t = _BY_LABEL.get(label)
        if t is None:
            raise ValueError(f"tier={label!r}: must be one of {TIER_LABELS}")
        return t


TIERS: tuple[Tier, ...] = tuple(Tier)
N_TIERS = len(TIERS)
# the tiers holding data in the cache's own memory (pools; a match end needs one of them)
RESIDENT: tuple[Tier, ...] = tuple(t for t in TIERS if t is not Tier.STORAGE)
_LABELS = {t: t.name.lower() for t in TIERS}
_REF_NAMES = {t: ("lock" if t == 0 else t.name.lower()) + "_ref" for t in TIERS}
TIER_LABELS: tuple[str, ...] = tuple(_LABELS[t] for t in TIERS)
_BY_LABEL = {lbl: t for t, lbl in _LABELS.items()}

# module-level names for the hot paths: plain ints (a global load, not an enum attribute
# lookup; and a list indexed by an exact int skips the subclass path: 13 vs 21 ns a lookup).
# Iterate ``TIERS`` for the members (``label``, ``ref_name``); compare with ``==``.
DEVICE = int(Tier.DEVICE)
HOST = int(Tier.HOST)
STORAGE = int(Tier.STORAGE)


def per_tier(value: object = 0) -> list:
    """A fresh list with one ``value`` per tier (immutable values only)."""
    return [value] * N_TIERS


__all__ = ["DEVICE", "HOST", "N_TIERS", "RESIDENT", "STORAGE", "TIERS", "TIER_LABELS", "Tier", "per_tier"]
