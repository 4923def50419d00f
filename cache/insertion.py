"""Insert: walk the key, settle overlaps per component, create the new leaf, donate the MAMBA
state, then recency, write-through backups and the MAMBA per-path cap. ``self`` is the cache
(``HiRadixCache``); validation happened in ``HiRadixCache.insert``."""

from __future__ import annotations

import torch

from radixscope.cache import eviction, transfers
from radixscope.cache.keys import match_len
from radixscope.cache.results import InsertResult
from radixscope.cache.tiers import DEVICE
from radixscope.cache.tree import Node


def insert_walk(self, tokens, extra_key, idx, swa, mamba_slot, prev, swa_ev) -> InsertResult:
    """The body of ``HiRadixCache.insert`` after validation (``self`` is the cache)."""
    tree = self.tree
    si = self.ci.get("swa")
    root = tree.root
    ps = self.page_size
    node, off, n = root, 0, len(tokens)
    swa_from = max(swa_ev, prev)  # the caller's live SWA slots start here
    # SWA is kept only on the key's last page-aligned window: a fresh leaf is capped there and
    # only tombstones inside it are healed (so a live sequence holds about one window of SWA)
    heal_from = max(swa_from, n - self.comps[si].window_paged) if si is not None else n
    while off < n:
        ck = tokens[off] if ps == 1 else tuple(tokens[off:off + ps])
        child = node.children.get((extra_key, ck) if node is root else ck)
        if child is None:
            break
        key = child.key
        k = len(key)
        if tokens[off:off + k] != key:  # whole-node match first: one C compare
            k = match_len(tokens, off, key, ps)
            if not k:
                break
        if k < len(child.key):
            child = self.split(child, k)
        if si is not None and off < heal_from < off + k and child.data[si].values[DEVICE] is None:
            child = self.split(child, heal_from - off)  # heal only the in-window live part
            k = len(child.key)
        _overlap(self, child, off, k, idx, swa, prev, swa_from, heal_from, si)
        node, off = child, off + k
    prefix_len = off
    if off < n and si is not None and off < heal_from:
        # below the window (or the caller's live SWA range): a FULL-only node, an SWA tombstone
        mid = min(heal_from, n)
        node = _new_leaf_with(self, node, tokens[off:mid], extra_key, idx, off, None, si)
        lo = max(off, swa_from)
        if lo < mid:  # the caller's live SWA slots there are not kept
            self.request_held[si][DEVICE] -= self.free_slots(si, DEVICE, swa[lo:mid])
        off = mid
    if off < n:
        node = _new_leaf_with(self, node, tokens[off:], extra_key, idx, off, swa, si)
    mamba_exist = False
    if mamba_slot is not None and node.parent is not None:
        mi = self.ci["mamba"]
        if node.data[mi].values[DEVICE] is not None:
            mamba_exist = True
            self.free_slots(mi, DEVICE, mamba_slot)
        else:
            self.set_value(node, mi, DEVICE, mamba_slot.clone())
        self.request_held[mi][DEVICE] -= 1
    elif mamba_slot is not None:
        self.free_slots(self.ci["mamba"], DEVICE, mamba_slot)
        self.request_held[self.ci["mamba"]][DEVICE] -= 1
    self.touch(node)
    backups = transfers.backup_after_insert(self, node) if node.parent is not None else ()
    if "mamba" in self.ci and node.parent is not None:
        eviction.enforce_mamba_cap(self, node)
    return InsertResult(prefix_len, node.id, n, n - prefix_len, mamba_exist, backups)

def _new_leaf_with(self, parent, key, extra_key, idx, off, swa, si) -> Node:
    leaf = self.new_leaf(parent, key, extra_key)
    end = off + len(key)
    self.set_value(leaf, 0, DEVICE, idx[off:end].clone())
    self.request_held[0][DEVICE] -= len(key)
    if swa is not None:
        self.set_value(leaf, si, DEVICE, swa[off:end].clone())
        self.request_held[si][DEVICE] -= len(key)
    return leaf

def _overlap(self, node: Node, off: int, k: int, idx, swa, prev: int, swa_from: int,
             heal_from: int, si: int | None) -> None:
    end = off + k
    f = node.data[0]
    if f.values[DEVICE] is None:
        if off >= prev:  # un-evict: adopt the caller's fresh slots
            self.set_value(node, 0, DEVICE, idx[off:end].clone())
            self.request_held[0][DEVICE] -= k
    else:
        lo = max(off, prev)
        if lo < end:
            self.free_slots(0, DEVICE, idx[lo:end])
            self.request_held[0][DEVICE] -= end - lo
    if si is None:
        return
    s = node.data[si]
    lo = max(off, swa_from)
    if lo >= end:
        return
    if s.values[DEVICE] is None and lo == off and off >= heal_from and node.data[0].values[DEVICE] is not None:
        self.set_value(node, si, DEVICE, swa[off:end].clone())  # heal the tombstone
    else:
        self.free_slots(si, DEVICE, swa[lo:end])
    self.request_held[si][DEVICE] -= end - lo


def check_indices(self, t, length: int, name: str, ci: int | None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of slot indices, got "
                        f"{type(t).__name__}")
    if t.dim() != 1 or t.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be a 1-D int64 tensor, got {t.dtype} "
                        f"shape {tuple(t.shape)}")
    if t.numel() != length:
        raise ValueError(f"{name} has {t.numel()} entries but the key has {length} tokens")
    t = t.to(device="cpu", dtype=torch.int64)
    if ci is not None:
        check_live(self, t, ci, name)
    return t

def check_live(self, t: torch.Tensor, ci: int, name: str) -> None:
    if t.numel():
        self.device_pools[ci].alloc.check_live(t, name)
