"""The L3 tier's write path: host copies go to storage, STORAGE values mark what landed.

A mixin of ``HiRadixCache`` (active only with ``storage=StorageSetup(...)``; without it none of
this runs). When a backup (device -> host) is acked, the chain of nodes above it that lack FULL
STORAGE (root-first, host-resident, not already being stored) is written to L3 per the storage
write policy: a frozen ``Transfer`` of kind ``store`` (``dst_tier`` ``storage``) whose pages a
writer thread stores with ``batch_set``. The host values it reads stay host-pinned (owner
``store:<tid>``) until ``poll`` acks it; then STORAGE values (``StoredPages``) are set for the
nodes whose pages all landed (FULL prefix-closed; SWA / MAMBA only where FULL is), failures are
counted and those nodes stay host-only. ``write_back`` instead writes a host leaf
synchronously right before host eviction deletes it (nothing to mark: the node goes).
With several ranks the acks are agreed: MIN of the finished stores, MIN of the pages landed.
"""

from __future__ import annotations

import time
from array import array

import torch

from radixscope.cache import events as ev
from radixscope.cache.keys import ceil_paged
from radixscope.cache.pools import StatePool
from radixscope.cache.results import PoolCopy, Transfer
from radixscope.cache.state import CacheCore
from radixscope.cache.storage.keys import Fingerprint, page_hashes
from radixscope.cache.storage.pages import HostPages
from radixscope.cache.storage.prefetch import PrefetchController
from radixscope.cache.storage.prefetch_op import PrefetchPool
from radixscope.cache.storage.setup import StorageCacheStats, StorageSetup, WriteCounters
from radixscope.cache.storage.stored import StoredPages
from radixscope.cache.storage.writer import StoreJob, StorePart, StoreWriter
from radixscope.cache.tiers import HOST, STORAGE
from radixscope.cache.tree import Node

STORE_OWNER = "store:"


def namespace_of(extra_key: object) -> str | None:
    """The page-hash namespace of a cache ``extra_key`` (None, a str or an int)."""
    return None if extra_key is None else f"{type(extra_key).__name__}:{extra_key}"


class HostSlots:
    """A component's host allocator as the prefetch sees it: takes slots (evicting host LRU
    first when short) and counts what it hands out as held by requests, so pool conservation
    holds while a prefetch owns them. Pinned nodes (the prefetch anchor) are never evicted."""

    def __init__(self, cache: StorageWrites, ci: int) -> None:
        self.cache, self.ci = cache, ci
        alloc = cache.host_pools[ci].alloc
        self.capacity, self.page_size, self.is_used = alloc.capacity, alloc.page_size, alloc.is_used

    def alloc(self, num_slots: int) -> torch.Tensor | None:
        c, ci = self.cache, self.ci
        alloc = c.host_pools[ci].alloc
        if alloc.available < num_slots:
            if alloc.available + c.evictable[ci][HOST] < num_slots:
                return None  # eviction could not make room: evict nothing
            c._evict_host_slots(ci, num_slots - alloc.available)
        out = c.take_slots(ci, HOST, num_slots)
        if out is not None:
            c.request_held[ci][HOST] += out.numel()
        return out

    def free(self, indices: torch.Tensor) -> int:
        n = self.cache.free_slots(self.ci, HOST, indices)
        self.cache.request_held[self.ci][HOST] -= n
        return n


class StorageWrites(CacheCore):
    """Construction of the L3 tier and its write path: methods of ``HiRadixCache``."""

    storage: StorageSetup | None = None

    # ---- construction ----------------------------------------------------------------------
    def _init_storage(self, setup: StorageSetup) -> None:
        if not isinstance(setup, StorageSetup):
            raise TypeError(f"storage must be a StorageSetup, got {type(setup).__name__}")
        if not self.config.has_host:
            raise ValueError("storage needs a host tier (host_tokens > 0): L3 pages pass "
                             "through host memory")
        group = setup.rank_group
        io_group = setup.io_group or (group if group.world_size == 1 else None)
        if io_group is None:
            raise ValueError("storage with several ranks needs a distinct io_group")
        ps = self.page_size
        dtype = str(self.config.dtype).removeprefix("torch.")
        tp = f";tp={group.rank}/{group.world_size}" if group.world_size > 1 else ""
        self.store_pages: list[HostPages] = []
        self.store_fps: list[Fingerprint] = []
        pools = []
        for comp in self.comps:
            pool = self.host_pools[comp.index]
            buf = pool.buf
            state = isinstance(pool, StatePool)
            pages = HostPages(buf, 1 if state else ps, 0 if state else 2)
            layers, heads, hd = ((1, 1, max(1, buf[0].numel())) if state
                                 else (buf.shape[0], buf.shape[3], buf.shape[4]))
            fp = Fingerprint(setup.model, dtype, layers, heads, hd, ps, comp.name,
                             pages.layout + tp)
            self.store_pages.append(pages)
            self.store_fps.append(fp)
            kind = "state" if comp.boundary_state else ("window" if comp.has_window else "prefix")
            wp = ceil_paged(comp.window, ps) // ps if kind == "window" else 0
            pools.append(PrefetchPool(comp.name, pages, HostSlots(self, comp.index), fp, kind, wp))
        self.prefetcher = PrefetchController(setup.backend, pools[0], pools[1:], setup.prefetch,
                                             group=group, io_group=io_group,
                                             observer=setup.observer)
        self.storage = setup
        self._group = group
        self._writer = StoreWriter(setup.backend, setup.observer)
        self._writes = WriteCounters()
        self._store_wanted: dict[int, None] = {}  # nodes whose chain waits to be stored

    def storage_close(self, timeout: float = 10.0) -> None:
        """Stop the prefetch worker (aborting what runs) and the store writer, acking what it
        wrote. Idempotent; a no-op without storage."""
        if self.storage is None or self._writer is None:
            return
        for req_id in list(self._pf):
            self.abort_prefetch(req_id)
        deadline = time.monotonic() + timeout
        self._ack_stores(True, deadline)  # a store a hung backend never finishes stays unacked
        self.prefetcher.close(max(0.0, deadline - time.monotonic()))
        self._writer.close(timeout)
        self._writer = None

    close = storage_close

    def storage_stats(self) -> StorageCacheStats:
        """The backend's counters, the write path's (failures per status), the prefetch's.
        Read-only; ValueError without storage."""
        if self.storage is None:
            raise ValueError("this cache has no storage tier")
        return StorageCacheStats(self.storage.backend.stats(), self._writes.freeze(),
                                 self.prefetcher.stats())

    # ---- hashes ----------------------------------------------------------------------------
    def _path_tokens(self, node: Node) -> array:
        out = array("Q")
        for x in reversed(self.tree.path_to_root(node)):
            out.extend(x.key)
        return out

    def _last_hash(self, node: Node) -> bytes | None:
        """The chained hash of ``node``'s last page (None for the root)."""
        if node.parent is None:
            return None
        st = node.data[0].values[STORAGE]
        if st is not None:
            return st.last
        return page_hashes(list(self._path_tokens(node)), self.page_size,
                           extra_key=namespace_of(node.extra_key))[-1]

    def _hashes_after(self, parent: Node, tokens, extra_key: object) -> tuple[bytes, ...]:
        prior = self._last_hash(parent)
        return page_hashes(list(tokens), self.page_size, prior=prior,
                           extra_key=None if prior is not None else namespace_of(extra_key))

    # ---- write path ------------------------------------------------------------------------
    def _store_after_backup(self, node: Node) -> None:
        """Called when a backup of ``node``'s chain is acked (write_through policies)."""
        policy = self.storage.write_policy
        if policy == "write_back" or node.parent is None:
            return
        if policy == "write_through_selective":
            while node.parent is not None and node.hit_count < self.storage.write_threshold:
                node = node.parent
        if node.parent is not None:
            self._store_wanted[node.id] = None

    def _start_wanted_stores(self) -> list[int]:
        """Start the stores asked for (at backup acks, hand-backs) whose whole path has landed
        on host: a node whose backup is still in flight has host slots its copy has not
        written yet (a subset poll may ack a child's backup before its parent's), so a chain
        through it waits. Each start is one ``store`` op record. Returns the transfer ids."""
        if not self._store_wanted:
            return []
        busy = {nid for tid, t in self.transfers.items() if t.kind == "backup"
                for nid in self.transfer_nodes[tid]}
        out = []
        for nid in list(self._store_wanted):
            node = self.tree.nodes.get(nid)
            path = [] if node is None else self.tree.path_to_root(node)
            if any(n.id in busy for n in path):
                continue
            del self._store_wanted[nid]
            if node is None:
                continue
            tok, t0 = self._begin(), time.time_ns()
            tid = self._store_chain(node)
            self._end_op(tok, ev.OP_STORE, None, {ev.A_NODE: nid, ev.A_TRANSFER: tid}, t0)
            if tid is not None:
                out.append(tid)
        return out

    def _storing(self) -> set[int]:
        return {nid for tid in self.store_transfers for nid in self.transfer_nodes[tid]}

    def _store_chain(self, node: Node) -> int | None:
        """Start a store of the nodes above ``node`` (inclusive) lacking FULL STORAGE: the
        root-first run of host-resident nodes below the deepest stored or storing ancestor.
        Returns the transfer id, or None when nothing needs writing."""
        storing = self._storing()
        chain: list[Node] = []
        for n in self.tree.path_to_root(node):
            if n.data[0].values[STORAGE] is not None or n.id in storing:
                break
            if n.data[0].values[HOST] is None:
                chain = []  # a gap: what lies below cannot be marked (prefix closure)
                continue
            chain.append(n)
        if not chain:
            return None
        chain.reverse()
        top = chain[0]
        tokens = array("Q")
        for n in chain:
            tokens.extend(n.key)
        hashes = self._hashes_after(top.parent, tokens, top.extra_key)
        tid = self._next_tid()
        parts, pins, copies = [], {}, []
        for comp in self.comps:
            ci = comp.index
            with_ci, keys, srcs, off = [], [], [], 0
            for n in chain:
                k = len(n.key) // self.page_size
                v = n.data[ci].values[HOST]
                if v is not None:
                    with_ci.append(n)
                    mine = hashes[off + k - 1:off + k] if comp.boundary_state else hashes[off:off + k]
                    keys += self.store_fps[ci].keys(mine)
                    srcs.append(v)
                off += k
            if with_ci:
                idx = torch.cat(srcs)
                pins[ci] = with_ci
                parts.append(StorePart(comp.name, self.store_pages[ci], tuple(keys), idx))
                copies.append(PoolCopy(comp.name, ev.TIER_HOST, ev.TIER_STORAGE, idx,
                                       torch.empty(0, dtype=torch.int64)))
        rid = self.acquire(chain[-1], HOST, pins, f"{STORE_OWNER}{tid}")
        job = StoreJob(tid, tuple(parts))
        t = Transfer(tid, "store", chain[-1].id, tuple(n.id for n in chain), tuple(copies),
                     self.current_op_id, (rid,), time.time_ns(),
                     {"start": self.tree.prefix_len(top.parent), "hashes": hashes, "job": job})
        self.store_transfers[tid] = t
        self.transfer_nodes[tid] = [n.id for n in chain]
        self._ledger.m(ev.TRANSFER_START, t.anchor, None, t.dst_tier,
                (tid, t.kind, t.node_ids, t.amounts()))
        self._writer.submit(job)
        return tid

    def _ack_stores(self, wait: bool, deadline: float | None = None) -> list[int]:
        """Ack finished stores in order (all of them with ``wait``, or those done by the
        monotonic ``deadline``), agreed over ranks."""
        if not self.store_transfers and self._group.world_size == 1:
            return []
        ready = 0
        for t in self.store_transfers.values():
            job = t.meta["job"]
            if wait:
                job.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not job.done.is_set():
                break
            ready += 1
        if self._group.world_size > 1:
            ready = self._group.all_reduce([ready], "min")[0]
        ts = list(self.store_transfers.values())[:ready]
        if not ts:
            return []
        landed = [n for t in ts for n in t.meta["job"].landed()]
        if self._group.world_size > 1:
            landed = self._group.all_reduce(landed, "min")
        out, i = [], 0
        for t in ts:
            k = len(t.meta["job"].parts)
            self._ack_store(t, landed[i:i + k])
            i += k
            out.append(t.transfer_id)
        return out

    def _ack_store(self, t: Transfer, landed: list[int]) -> None:
        tok = self._begin()
        job: StoreJob = t.meta["job"]
        for rid in t.receipts:
            self.release(self.locks[rid])
        del self.store_transfers[t.transfer_id]
        covered = self.transfer_nodes.pop(t.transfer_id, ())
        failed = 0
        w = self._writes
        for st, n in zip(job.statuses, landed, strict=True):
            for s in st[n:]:
                w.fail(s.value if not s.ok else "peer_rank")
            failed += len(st) - n
            with w.lock:
                w.pages_stored += n
        with w.lock:
            w.transfers += 1
        ok_keys = [set(p.keys[:n]) for p, n in zip(job.parts, landed, strict=True)]
        by_comp = {p.component: s for p, s in zip(job.parts, ok_keys, strict=True)}
        self._mark_stored(covered, t.meta["start"], t.meta["hashes"], by_comp)
        self._ledger.m(ev.TRANSFER_DONE, t.anchor, None, t.dst_tier, (t.transfer_id, failed == 0))
        attrs = {ev.A_TRANSFER: t.transfer_id, ev.A_TRANSFER_KIND: t.kind, ev.A_NODE: t.anchor,
                 ev.A_ENQUEUED_BY: t.enqueued_by,
                 ev.A_BYTES: sum(n * p.pages.page_nbytes for p, n in zip(job.parts, landed,
                                                                          strict=True)),
                 ev.A_TOKENS: dict(t.amounts()).get(self.comps[0].name, 0),
                 ev.A_FREED: dict(t.amounts()), ev.A_NODES: len(t.node_ids),
                 ev.A_STORAGE_FAILED: failed}
        self.end_transfer(tok, attrs, t.created_ns)

    def _mark_stored(self, covered, start: int, hashes, ok: dict[str, set[str]]) -> None:
        """Set STORAGE values on the covered nodes (root-first) whose pages all landed."""
        ps = self.page_size
        nodes = [self.tree.nodes[i] for i in covered if i in self.tree.nodes]
        nodes.sort(key=self.tree.prefix_len)
        for n in nodes:
            par = n.parent
            if n.data[0].values[STORAGE] is not None:
                continue
            if par.parent is not None and par.data[0].values[STORAGE] is None:
                break  # prefix closure: nothing deeper can be marked
            a = (self.tree.prefix_len(n) - len(n.key) - start) // ps
            mine = hashes[a:a + len(n.key) // ps]
            for comp in self.comps:
                ci = comp.index
                d = n.data[ci]
                if ci and (d.values[HOST] is None or d.values[STORAGE] is not None):
                    continue
                sel = mine[-1:] if comp.boundary_state else mine
                if not set(self.store_fps[ci].keys(sel)) <= ok.get(comp.name, set()):
                    if ci == 0:
                        return
                    continue
                self.set_value(n, ci, STORAGE, StoredPages(sel, ps, comp.boundary_state))
            with self._writes.lock:
                self._writes.nodes_stored += 1

    def _write_back_leaf(self, node: Node) -> None:
        """write_back: store a host leaf's pages synchronously before host eviction deletes it
        (every component it holds on host). Failures are counted; nothing is marked."""
        if node.data[0].values[STORAGE] is not None or node.data[0].values[HOST] is None:
            return
        hashes = self._hashes_after(node.parent, node.key, node.extra_key)
        backend = self.storage.backend
        for comp in self.comps:
            v = node.data[comp.index].values[HOST]
            if v is None:
                continue
            sel = hashes[-1:] if comp.boundary_state else hashes
            r = backend.batch_set(self.store_fps[comp.index].keys(sel),
                                  self.store_pages[comp.index], v)
            if self._writer is not None:
                self._writer.emit_set(comp.name, r)
            with self._writes.lock:
                self._writes.write_back_pages += r.ok_count
            for s in r.statuses:
                if not s.ok:
                    self._writes.fail(s.value)


__all__ = ["STORE_OWNER", "HostSlots", "StorageWrites", "namespace_of"]
