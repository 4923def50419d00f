"""Insertion: ``insert`` validates, then walks the key, settles overlaps per component,
creates the new leaf, donates the MAMBA state, then recency, write-through backups and the
MAMBA per-path cap. A mixin of ``HiRadixCache``."""

from __future__ import annotations

import dataclasses

import torch

from radixscope.cache import events as ev
from radixscope.cache.components import STATE, WINDOW
from radixscope.cache.keys import check_namespace, key_len, normalize_key
from radixscope.cache.pools import _np
from radixscope.cache.results import InsertResult, TransferId
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import DEVICE
from radixscope.cache.tree import Node


def _keeps_swa(off: int, end: int, heal_from: int, keep_lo: int, branch: int) -> bool:
    """Whether tokens ``[off, end)`` of the key keep SWA: inside the key's last window (from
    ``heal_from``) or inside the window behind the branching point (``[keep_lo, branch)``)."""
    return off >= heal_from or keep_lo <= off and end <= branch


def _owned(part) -> tuple[torch.Tensor, object]:
    """A node's own copy of a slice of the caller's slots (a numpy slice), and that copy as
    numpy (``set_value``'s ``pages``)."""
    own = part.copy()
    return torch.from_numpy(own), own


class Insertion(CacheCore):
    """``insert``: cache a request's key with its slots."""

    def insert(self, key, device_indices: torch.Tensor, *, extra_key=None,
               swa_indices: torch.Tensor | None = None, mamba_slot: torch.Tensor | None = None,
               prev_prefix_len: int = 0, swa_evicted_len: int = 0, branch_len: int = 0,
               mamba_branch_slot: torch.Tensor | None = None,
               req_id: str | None = None) -> InsertResult:
        """Cache ``key`` with the caller's FULL device slots (and SWA slots / MAMBA state).

        Args:
            key: token ids; truncated to whole pages. ``device_indices`` must have ``len(key)``
                entries; those beyond the page-aligned length stay with the caller.
            swa_indices: with SWA, the caller's SWA slots per position (positions below
                ``swa_evicted_len`` are ignored: the caller already freed them).
            mamba_slot: with MAMBA, a 1-element tensor: the state at the key's end, donated.
            prev_prefix_len: the caller's prefix that came from the tree (its slots are the
                tree's own and are never freed here).
            branch_len: a branching point (``MatchResult.branch_len``; 0: none), page-aligned,
                past ``prev_prefix_len`` and within the key: a node ends there, and it keeps the
                SWA window behind it (the part the caller's live SWA slots cover) besides the
                key's last window, so the next request over this prefix matches up to it.
            mamba_branch_slot: with MAMBA and a ``branch_len`` short of the key's end, a
                1-element tensor: the state at ``branch_len``, donated to the node ending there.
        Returns: ``InsertResult``; ``prefix_len`` tokens were already present and the caller's
            slots for them (at or beyond ``prev_prefix_len``) were freed.
        Mutates: new leaf / splits; un-evicts host-only nodes by adopting the caller's slots;
            heals SWA tombstones inside the caller's live range; donates the MAMBA state (and the
            branching point's); hit counts and recency; write-through backups; the MAMBA
            per-path cap.
        Emits: one ``insert`` op; structure, state, pool and transfer mutations.
        """
        raw_len = key_len(key)
        tokens = normalize_key(key, self.page_size)
        check_namespace(extra_key)
        idx = self._check_indices(device_indices, raw_len, "device_indices", None)
        swa = None
        if WINDOW in self.ci:
            if swa_indices is None:
                raise ValueError(f"swa_indices is required when the {WINDOW!r} component is configured")
            swa = self._check_indices(swa_indices, raw_len, "swa_indices", None)
        elif swa_indices is not None:
            raise ValueError(f"swa_indices given but the {WINDOW!r} component is not configured")
        if (mamba_slot is not None or mamba_branch_slot is not None) and STATE not in self.ci:
            name = "mamba_slot" if mamba_slot is not None else "mamba_branch_slot"
            raise ValueError(f"{name} given but the {STATE!r} component is not configured")
        if mamba_slot is not None:
            mamba_slot = self._check_indices(mamba_slot, 1, "mamba_slot", None)
        for name, v in (("prev_prefix_len", prev_prefix_len), ("swa_evicted_len", swa_evicted_len),
                        ("branch_len", branch_len)):
            if type(v) is not int and (isinstance(v, bool) or not isinstance(v, int)) or v < 0:
                raise ValueError(f"{name}={v!r} must be an int >= 0")
            if v and name != "prev_prefix_len" and v % self.page_size:
                raise ValueError(f"{name}={v} must be page-aligned (page_size={self.page_size})")
        if branch_len and not prev_prefix_len < branch_len <= len(tokens):
            raise ValueError(f"branch_len={branch_len} must be 0 or past prev_prefix_len="
                             f"{prev_prefix_len} and within the key's {len(tokens)} whole-page "
                             "tokens")
        if mamba_branch_slot is not None:
            if not 0 < branch_len < len(tokens):
                raise ValueError(f"mamba_branch_slot needs a branch_len short of the key's end "
                                 f"(0 < branch_len < {len(tokens)}), got branch_len={branch_len}; "
                                 "the state at the key's end is mamba_slot")
            mamba_branch_slot = self._check_indices(mamba_branch_slot, 1, "mamba_branch_slot",
                                                    None)
        # numpy views of the caller's slots: the guard and the walk slice them (a numpy slice
        # costs a fifth of a tensor's); a node keeps a copy of its part (``_owned``)
        idx = _np(idx)
        swa = None if swa is None else _np(swa)
        start = self._check_insert_slots(tokens, extra_key, idx, swa, mamba_slot,
                                         prev_prefix_len, swa_evicted_len, mamba_branch_slot)
        n = len(tokens)
        if n < raw_len:  # the caller keeps the slots past the last whole page
            idx = idx[:n]
            swa = None if swa is None else swa[:n]
        out = self._ledger.run(ev.OP_INSERT, req_id, self._insert_walk, tokens, extra_key, idx, swa,
                        mamba_slot, prev_prefix_len, swa_evicted_len, start, branch_len,
                        mamba_branch_slot)
        if not out.backups:
            return out
        return dataclasses.replace(out, backups=tuple(TransferId(t, self.instance)
                                                      for t in out.backups))

    def _insert_walk(self, tokens, extra_key, idx, swa, mamba_slot, prev, swa_ev,
                     start: tuple, branch: int = 0, mamba_branch=None) -> InsertResult:
        """The body of ``HiRadixCache.insert`` after validation (``self`` is the cache),
        resuming at ``start`` = ``(node, off)``, where the guard's walk stopped."""
        tree = self.tree
        si = self.ci.get(WINDOW)
        (node, off), n = start, len(tokens)
        at_end = 0 < branch == n
        if at_end:
            branch = 0  # the key's end: its own window and state are kept anyway
        swa_from = max(swa_ev, prev)  # the caller's live SWA slots start here
        # SWA is kept only on the key's last page-aligned window (a fresh leaf is capped there
        # and only tombstones inside it are healed, so a live sequence holds about one window of
        # SWA) and on the window behind a branching point: [keep_lo, branch)
        heal_from = keep_lo = n
        if si is not None:
            w = self.comps[si].window_paged
            heal_from = max(swa_from, n - w)
            if branch and max(swa_from, branch - w) < branch:
                keep_lo = max(swa_from, branch - w)
                if branch >= heal_from:  # the two windows meet: one range to the key's end
                    heal_from, keep_lo = min(heal_from, keep_lo), n
        branch_node = None
        descend = tree.descend
        while off < n:
            step = descend(node, tokens, off, extra_key)
            if step is None:
                break
            child, k = step
            if k < len(child.key):
                child = self.split(child, k)
            # a node ends at the branching point, and where kept SWA starts on a tombstone
            end = off + k
            cut = branch if off < branch < end else end
            if si is not None and child.data[si].values[DEVICE] is None:
                if off < keep_lo < cut:
                    cut = keep_lo
                if off < heal_from < cut:
                    cut = heal_from
            if cut < end:
                child = self.split(child, cut - off)
                k = cut - off
            self._overlap(child, off, k, idx, swa, prev, swa_from, heal_from, keep_lo, branch, si)
            node, off = child, off + k
            if off == branch:
                branch_node = child
        prefix_len = off
        if off < n and si is None and not off < branch < n:  # FULL alone, one new leaf
            node = self._new_leaf_with(node, tokens[off:], extra_key, idx, off, None, None)
        elif off < n:  # new leaves, cut at the same points
            for end in (*sorted({c for c in (keep_lo, branch, heal_from) if off < c < n}), n):
                keep = si is not None and _keeps_swa(off, end, heal_from, keep_lo, branch)
                node = self._new_leaf_with(node, tokens[off:end], extra_key, idx, off,
                                           swa if keep else None, si)
                lo = max(off, swa_from)
                if si is not None and not keep and lo < end:  # the caller's live SWA there goes
                    self.request_held[si][DEVICE] -= self.free_slots(si, DEVICE, swa[lo:end])
                off = end
                if off == branch:
                    branch_node = node
        mamba_exist = False
        if mamba_slot is not None and node.parent is not None:
            mamba_exist = self._donate_state(node, mamba_slot)
        elif mamba_slot is not None:
            self.free_slots(self.ci[STATE], DEVICE, mamba_slot)
            self.request_held[self.ci[STATE]][DEVICE] -= 1
        # the guard made sure a node ends at the branching point when a state is given for it
        branch_exist = mamba_branch is not None and self._donate_state(branch_node, mamba_branch)
        self.touch(node)
        backups = self._backup_after_insert(node) if node.parent is not None else ()
        if STATE in self.ci and node.parent is not None:
            self._enforce_mamba_cap(node)
        if at_end:
            branch_node = node
        return InsertResult(prefix_len, node.id, n, n - prefix_len, mamba_exist, backups,
                            None if branch_node is None else branch_node.id, branch_exist)

    def _donate_state(self, node: Node, slot: torch.Tensor) -> bool:
        """Give ``node`` the caller's MAMBA state (a copy of the slot index); when it already
        holds one, free the caller's slot instead. Returns whether it already held one."""
        mi = self.ci[STATE]
        exist = node.data[mi].values[DEVICE] is not None
        if exist:
            self.free_slots(mi, DEVICE, slot)
        else:
            self.set_value(node, mi, DEVICE, slot.clone())
        self.request_held[mi][DEVICE] -= 1
        return exist

    def _new_leaf_with(self, parent, key, extra_key, idx, off, swa, si) -> Node:
        leaf = self.new_leaf(parent, key, extra_key)
        end = off + len(key)
        self.set_value(leaf, 0, DEVICE, *_owned(idx[off:end]))
        self.request_held[0][DEVICE] -= len(key)
        if swa is not None:
            self.set_value(leaf, si, DEVICE, *_owned(swa[off:end]))
            self.request_held[si][DEVICE] -= len(key)
        return leaf

    def _overlap(self, node: Node, off: int, k: int, idx, swa, prev: int, swa_from: int,
                 heal_from: int, keep_lo: int, branch: int, si: int | None) -> None:
        end = off + k
        f = node.data[0]
        if f.values[DEVICE] is None:
            if off >= prev:  # un-evict: adopt the caller's fresh slots
                self.set_value(node, 0, DEVICE, *_owned(idx[off:end]))
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
        if (s.values[DEVICE] is None and lo == off and _keeps_swa(off, end, heal_from, keep_lo, branch)
                and node.data[0].values[DEVICE] is not None):
            self.set_value(node, si, DEVICE, *_owned(swa[off:end]))  # heal the tombstone
        else:
            self.free_slots(si, DEVICE, swa[lo:end])
        self.request_held[si][DEVICE] -= end - lo

    def _check_indices(self, t, length: int, name: str, ci: int | None) -> torch.Tensor:
        if (type(t) is torch.Tensor and t.dtype is torch.int64 and t.dim() == 1 and t.is_cpu
                and t.numel() == length and ci is None):
            return t  # the common case, in the fewest calls
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of slot indices, got "
                            f"{type(t).__name__}")
        if t.dim() != 1 or t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be a 1-D int64 tensor, got {t.dtype} "
                            f"shape {tuple(t.shape)}")
        if t.numel() != length:
            raise ValueError(f"{name} has {t.numel()} entries but the key has {length} tokens")
        if t.dtype is not torch.int64 or not t.is_cpu:
            t = t.to(device="cpu", dtype=torch.int64)
        if type(t) is not torch.Tensor:
            # a caller's subclass is kept as a plain tensor: the tree's containers are untracked
            # by the collector (``native.untrack``), so one that referred back to the cache
            # would be a cycle never freed
            t = t.as_subclass(torch.Tensor)
            if type(t) is not torch.Tensor:
                raise TypeError(f"{name}: a {type(t).__name__} that cannot be viewed as a plain "
                                "torch.Tensor")
        if ci is not None:
            self._check_live(t, ci, name)
        return t

    def _check_live(self, t: torch.Tensor, ci: int, name: str) -> None:
        if t.numel():
            self.device_pools[ci].alloc.check_live(t, name)
