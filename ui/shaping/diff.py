"""What changed between two snapshots: nodes created / deleted, per component and tier state
changes, re-keyed (split) nodes, locks taken / released, and pool deltas."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from radixscope.cache.snapshot import CacheSnapshot
from radixscope.cache.tiers import TIER_LABELS

ADDED, REMOVED, RESIZED, REFS = "added", "removed", "resized", "refs"


@dataclass(frozen=True)
class SnapshotDiff:
    """``before.seq`` -> ``after.seq``. Every field is a DataFrame (possibly empty)."""

    seq_before: int
    seq_after: int
    created: pd.DataFrame  # node_id, parent_id, tokens
    deleted: pd.DataFrame  # node_id, parent_id, tokens
    changes: pd.DataFrame  # node_id, component, tier, change, len_before/after, refs_before/after
    rekeyed: pd.DataFrame  # node_id, tokens_before, tokens_after, parent_before, parent_after
    locks: pd.DataFrame  # receipt, owner, anchor, change (acquired / released)
    pools: pd.DataFrame  # component, tier, <field>_before, <field>_after, <field>_delta

    def counts(self) -> dict[str, int]:
        """Headline numbers: created, deleted, state changes, re-keyed, locks +/-."""
        lk = self.locks["change"].value_counts() if not self.locks.empty else {}
        return {"created": len(self.created), "deleted": len(self.deleted),
                "state_changes": len(self.changes), "rekeyed": len(self.rekeyed),
                "locks_acquired": int(lk.get("acquired", 0)),
                "locks_released": int(lk.get("released", 0))}

    def change_matrix(self) -> pd.DataFrame:
        """State changes counted per ``component, tier`` (rows) and change kind (columns)."""
        if self.changes.empty:
            return pd.DataFrame(columns=[ADDED, REMOVED, RESIZED, REFS])
        m = self.changes.pivot_table(index=["component", "tier"], columns="change",
                                     values="node_id", aggfunc="count", fill_value=0)
        return m.reindex(columns=[ADDED, REMOVED, RESIZED, REFS], fill_value=0).astype("int64")


def diff_snapshots(before: CacheSnapshot, after: CacheSnapshot) -> SnapshotDiff:
    """Compare two snapshots of the same cache.

    Raises:
        ValueError: the snapshots have different components or page sizes.
    """
    if before.components != after.components or before.page_size != after.page_size:
        raise ValueError(f"cannot diff snapshots of different caches: components "
                         f"{before.components} vs {after.components}, page size "
                         f"{before.page_size} vs {after.page_size}")
    a = {n.node_id: n for n in before.nodes}
    b = {n.node_id: n for n in after.nodes}
    created = [(i, b[i].parent_id, b[i].key_len) for i in sorted(b.keys() - a.keys())]
    deleted = [(i, a[i].parent_id, a[i].key_len) for i in sorted(a.keys() - b.keys())]
    changes, rekeyed = [], []
    for i in sorted(a.keys() & b.keys()):
        na, nb = a[i], b[i]
        if na.key_len != nb.key_len or na.parent_id != nb.parent_id:
            rekeyed.append((i, na.key_len, nb.key_len, na.parent_id, nb.parent_id))
        for comp, ca, cb in zip(before.components, na.components, nb.components, strict=True):
            if ca == cb:
                continue
            for tier, la, lb, ra, rb in zip(TIER_LABELS, ca.lens, cb.lens, ca.refs, cb.refs,
                                            strict=True):
                kind = _change(la, lb, ra, rb)
                if kind:
                    changes.append((i, comp, tier, kind, _n(la), _n(lb), ra, rb))
    return SnapshotDiff(
        before.seq, after.seq,
        pd.DataFrame(created, columns=["node_id", "parent_id", "tokens"]),
        pd.DataFrame(deleted, columns=["node_id", "parent_id", "tokens"]),
        pd.DataFrame(changes, columns=["node_id", "component", "tier", "change", "len_before",
                                       "len_after", "refs_before", "refs_after"]),
        pd.DataFrame(rekeyed, columns=["node_id", "tokens_before", "tokens_after",
                                       "parent_before", "parent_after"]),
        _locks(before, after), _pools(before, after))


def _n(v: int | None) -> int:
    return -1 if v is None else v


def _change(la: int | None, lb: int | None, ra: int, rb: int) -> str | None:
    if la is None and lb is not None:
        return ADDED
    if la is not None and lb is None:
        return REMOVED
    if la != lb:
        return RESIZED
    if ra != rb:
        return REFS
    return None


def _locks(before: CacheSnapshot, after: CacheSnapshot) -> pd.DataFrame:
    a = {lk.receipt_id: lk for lk in before.locks}
    b = {lk.receipt_id: lk for lk in after.locks}
    rows = [(r, b[r].owner, b[r].anchor, "acquired") for r in sorted(b.keys() - a.keys())]
    rows += [(r, a[r].owner, a[r].anchor, "released") for r in sorted(a.keys() - b.keys())]
    return pd.DataFrame(rows, columns=["receipt", "owner", "anchor", "change"])


_POOL_FIELDS = ("available", "evictable", "protected", "in_flight")


def _pools(before: CacheSnapshot, after: CacheSnapshot) -> pd.DataFrame:
    a = {(p.component, p.tier): p for p in before.pools}
    rows = []
    for p in after.pools:
        q = a.get((p.component, p.tier))
        if q is None:
            continue
        row: dict = {"component": p.component, "tier": p.tier}
        for f in _POOL_FIELDS:
            x, y = getattr(q, f), getattr(p, f)
            row[f"{f}_before"], row[f"{f}_after"], row[f"{f}_delta"] = x, y, y - x
        rows.append(row)
    return pd.DataFrame(rows)
