"""Input guards for the public operations: handles from another cache, transfer ids that cannot
be acked, and slots a caller hands over that it does not hold.

Every guard raises ``TypeError`` / ``ValueError`` naming the bad value before anything changes,
and costs at most O(len) of its input (no tree scan): ``insert``'s walk below ``prev_prefix_len``
is done once, by its guard, and the insert resumes where the guard stopped.
"""

from __future__ import annotations

import numpy as np
import torch

from radixscope.cache.components import STATE, WINDOW
from radixscope.cache.tiers import DEVICE


def _describe(handle) -> str:
    for attr in ("best_match_node", "anchor", "receipt_id"):
        if hasattr(handle, attr):
            return f"({attr}={getattr(handle, attr)})"
    return repr(handle)


class Guards:
    """The input guards, as methods of the cache (mixed into ``HiRadixCache``)."""

    def _check_handle(self, handle, what: str) -> None:
        """A result handle must come from this cache (``cache_instance``)."""
        inst = getattr(handle, "cache_instance", None)
        if inst != self.instance:
            raise ValueError(f"{what} {_describe(handle)} belongs to another cache instance "
                             f"({inst}), not to this one ({self.instance})")

    def _check_poll_ids(self, transfer_ids) -> list[int]:
        """Transfer ids ``poll`` may ack: ints issued by this cache, in flight, each named once."""
        try:
            ids = list(transfer_ids)
        except TypeError:
            raise TypeError(f"transfer_ids must be an iterable of transfer ids or None, got "
                            f"{transfer_ids!r}") from None
        seen: set[int] = set()
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int):
                raise TypeError(f"transfer id {t!r} must be an int (a TransferId)")
            inst = getattr(t, "cache_instance", self.instance)
            if inst != self.instance:
                raise ValueError(f"transfer {int(t)} belongs to another cache instance ({inst}), "
                                 f"not to this one ({self.instance})")
            if t in seen:
                raise ValueError(f"transfer {int(t)} appears more than once in one poll")
            seen.add(t)
            if t not in self.transfers:
                if 0 < t < self._next_transfer:
                    raise ValueError(f"transfer {int(t)} was already acked")
                raise ValueError(f"transfer {int(t)} is not in flight (never started)")
        return [int(t) for t in ids]

    def _device_prefix_len(self, tokens, extra_key) -> int:
        """Tokens of ``tokens`` the tree holds with FULL on device, from the root (read-only)."""
        return self._device_prefix(tokens, extra_key, len(tokens))[2]

    def _device_prefix(self, tokens, extra_key, stop: int) -> tuple:
        """Walk ``tokens`` down the nodes holding FULL on device (read-only). Returns
        ``(node, off, have)``: the deepest node whose whole key matched and that ends at or
        before ``stop``, where it ends, and the device prefix length the walk established (it
        stops once that reaches ``stop``)."""
        descend = self.tree.descend
        node = self.tree.root
        off = have = 0
        while have < stop:
            step = descend(node, tokens, off, extra_key)
            if step is None:
                break
            child, k = step
            if child.data[0].values[DEVICE] is None:
                break
            have = off + k
            if k < len(child.key) or have > stop:
                break
            node, off = child, have
        return node, off, have

    def _check_insert_slots(self, tokens, extra_key, idx: np.ndarray,
                           swa: np.ndarray | None, mamba_slot: torch.Tensor | None, prev: int,
                           swa_ev: int, mamba_branch: torch.Tensor | None = None) -> tuple:
        """The caller's slots for ``insert``: below ``prev`` the tree's own (the tree must hold that
        much of the key on device, in those slots' pages); from ``prev`` on allocated, held by the
        request (not by a node) and named once, per component. Read-only; raises before the
        insert changes anything.

        Returns ``(node, off)``: where the insert walk resumes. The nodes above it lie wholly
        below ``prev`` with FULL on device, where the walk has nothing to do (no split, no
        slot to free or adopt, no tombstone to heal: all of that starts at ``prev``), so the
        path is walked once, here."""
        n = len(tokens)
        node, off = self.tree.root, 0
        if prev:
            node, off, have = self._device_prefix(tokens, extra_key, prev)
            if prev > have:
                have = self._device_prefix_len(tokens, extra_key)
                raise ValueError(f"prev_prefix_len={prev} but the tree holds only {have} tokens of "
                                 "this key on device")
        # below prev: the tree's own slots; from prev on: held by the request, each once
        self.device_pools[0].alloc.check_split(idx[:n], prev, "device_indices below "
                                               "prev_prefix_len", "device_indices")
        if swa is not None:
            lo = min(max(swa_ev, prev), n)
            if n > lo:
                self.device_pools[self.ci[WINDOW]].alloc.check_request_held(swa[lo:n], "swa_indices")
        if mamba_slot is not None:
            self.device_pools[self.ci[STATE]].alloc.check_request_held(mamba_slot, "mamba_slot")
        if mamba_branch is not None:
            self.device_pools[self.ci[STATE]].alloc.check_request_held(mamba_branch,
                                                                       "mamba_branch_slot")
            if mamba_slot is not None and int(mamba_branch[0]) == int(mamba_slot[0]):
                raise ValueError(f"mamba_branch_slot and mamba_slot are the same slot "
                                 f"({int(mamba_slot[0])}): two states need two slots")
        return node, off


__all__ = ["Guards"]
