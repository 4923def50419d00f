"""Matching: ``match_prefix`` and its copy-on-write of a MAMBA state. A mixin of
``HiRadixCache``: methods over the cache's tree, components and transfers."""

from __future__ import annotations

import torch

from radixscope.cache import events as ev
from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.cache.components.base import ANY_OK, DEV_OK
from radixscope.cache.keys import check_namespace, normalize_key
from radixscope.cache.results import MatchResult
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import DEVICE, HOST
from radixscope.cache.tree import Node

_EMPTY = torch.empty(0, dtype=torch.int64)


class Matching(CacheCore):
    """``match_prefix``: the longest cached prefix, per tier and component."""

    def match_prefix(self, key, *, extra_key=None, cow_mamba: bool = False,
                     req_id: str | None = None, prefetch: bool = False) -> MatchResult:
        """Longest cached prefix of ``key`` (truncated to whole pages) in namespace ``extra_key``.

        Returns a frozen ``MatchResult`` (see its docstring for every field). What it returns is
        readable: a load-back still in flight over the returned device prefix is made visible
        first (CPU: its pending copy runs now; CUDA: the current stream waits on its event); the
        load-back is still acked by ``poll``.
        Mutates: splits the node where the match ends inside it (new node ids); recency and hit
        counts of ``best_match_node`` and its ancestors; with ``cow_mamba``, when no load-back is
        needed (``last_device_node == best_match_node``), allocates a request MAMBA slot
        (evicting if needed) and copies the state there; when a load-back is needed the copy
        comes from ``load_back(match, cow_mamba=True)``, from the anchor's state.
        With ``prefetch=True`` (needs ``req_id``) and a storage tier: starts an L3 prefetch of
        the whole pages past the host match for ``req_id`` unless one is running or done
        (``prefetch_status``), host-pinning the last host node while it runs; see
        ``l3_prefetch.py``.
        ``branch_len``: where FULL's match ends past the auxiliary components' (the branching
        point an ``insert`` can fill in; see ``MatchResult``).
        Emits: one ``match`` op; ``node.split``, ``comp.state``, ``node.touch`` mutations.
        """
        tokens = normalize_key(key, self.page_size)
        check_namespace(extra_key)
        if prefetch is not False:
            if prefetch is not True:
                raise TypeError(f"prefetch={prefetch!r} must be a bool")
            if not isinstance(req_id, str) or not req_id:
                raise ValueError(f"prefetch=True needs a req_id (a non-empty str), got {req_id!r}")
            if self.storage is not None:
                return self._ledger.run(ev.OP_MATCH, req_id, self._match_prefetch, tokens,
                                        extra_key, bool(cow_mamba), req_id)
        return self._ledger.run(ev.OP_MATCH, req_id, self._match, tokens, extra_key,
                                bool(cow_mamba))

    def _match(self, tokens, extra_key, cow: bool) -> MatchResult:
        tree = self.tree
        root = tree.root
        # FULL (component 0) is checked inline; auxiliary checks may be stateful (SWA), so
        # each sees every node of the path top-down
        aux = self.comps[1:]
        checks = [c.path_check() for c in aux]
        path: list[Node] = []
        last_dev = best = -1
        full_len = dev_len = best_len = 0
        node, off, n = root, 0, len(tokens)
        descend = tree.descend
        while off < n:
            step = descend(node, tokens, off, extra_key)
            if step is None:
                break
            child, k = step
            if k < len(child.key):
                child = self.split(child, k)
            path.append(child)
            off += k
            fv = child.data[0].values
            f_dev = fv[DEVICE] is not None
            f_any = f_dev or fv[HOST] is not None  # resident, or loadable back from host
            # every check sees the node (no short cut: they are stateful); a plain loop, as a
            # comprehension is a call of its own on every node of the path
            ok = DEV_OK | ANY_OK
            for check in checks:
                ok &= check(child)
            if f_dev and ok & DEV_OK:
                last_dev = len(path) - 1
                dev_len = off
            if f_any and ok & ANY_OK:
                best = len(path) - 1
                best_len = off
            if not f_any:
                break
            full_len = off
            node = child
        matched = full_len
        dev_nodes = path[:last_dev + 1]
        idx = torch.cat([x.data[0].values[DEVICE] for x in dev_nodes]) if dev_nodes else _EMPTY
        if self.loading:
            self._make_ready_nodes(dev_nodes)  # readable on return, CoW source included
        best_node = path[best] if best >= 0 else tree.root
        if aux or last_dev != best:
            up = path[:best + 1][::-1]
            hits = {c.name: c.host_hit_length(up) for c in self.comps}
        else:  # FULL alone, resident on device up to the match end: nothing to load back
            hits = {BACKBONE: 0}
        mamba_slot = None
        if best >= 0:
            self.touch(best_node)
        if cow and STATE in self.ci and last_dev >= 0 and last_dev == best:
            mamba_slot = self._cow_mamba(path[last_dev])  # else load_back(cow_mamba=True)
        return MatchResult(
            device_indices=idx, device_prefix_len=dev_len,
            last_device_node=path[last_dev].id if last_dev >= 0 else tree.root.id,
            last_host_node=best_node.id, best_match_node=best_node.id,
            host_hit_length=hits[BACKBONE], swa_host_hit_length=hits.get(WINDOW, 0),
            mamba_host_hit_length=hits.get(STATE, 0), matched_len=matched, key_len=n,
            extra_key=extra_key, branch_len=matched if matched > best_len else 0,
            mamba_slot=mamba_slot, cache_instance=self.instance)

    def _cow_mamba(self, node: Node) -> torch.Tensor | None:
        ci = self.ci[STATE]
        src = node.data[ci].values[DEVICE]
        if src is None:
            return None
        rid = self.acquire(node, DEVICE, {0: self.tree.path_to_root(node), ci: [node]}, "cow")
        try:
            slot = self._alloc(ci, 1)
        finally:
            self.release(self.locks[rid])
        pool = self.device_pools[ci]
        pool.write(slot, pool.read(src))
        return slot
