"""``HiRadixCache``: the public operations. The tree decides, ``CacheCore`` executes.

Every public operation takes an optional ``req_id`` (the caller's request id), records one op
record and its mutations into the recorder, and documents Args / Returns / Mutates. Bad input
raises TypeError/ValueError naming the value before anything changes. See cache/README.md.
"""

from __future__ import annotations

import itertools

import torch

from radixscope.cache import events as ev
from radixscope.cache import leaves, ledger, native
from radixscope.cache.admission import Admitting
from radixscope.cache.components import BACKBONE, STATE
from radixscope.cache.config import CacheConfig
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.events import Recorder
from radixscope.cache.eviction import Eviction
from radixscope.cache.guards import Guards
from radixscope.cache.insertion import Insertion
from radixscope.cache.invariants import Invariants
from radixscope.cache.keys import ceil_paged
from radixscope.cache.l3_checks import StorageInvariants
from radixscope.cache.l3_prefetch import StoragePrefetch
from radixscope.cache.l3_writes import StorageWrites
from radixscope.cache.locks import Locks
from radixscope.cache.matching import Matching
from radixscope.cache.results import (
    LoadBackResult,
    MatchResult,
    TransferId,
)
from radixscope.cache.snapshot import CacheSnapshot
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import DEVICE, Tier, per_tier
from radixscope.cache.transfer_engine import TransferEngine
from radixscope.cache.transfers import Transfers
from radixscope.cache.tree import Node

_instances = itertools.count(1)
_EMPTY = torch.empty(0, dtype=torch.int64)


class HiRadixCache(Matching, Insertion, Locks, Eviction, Transfers, StoragePrefetch,
                   StorageWrites, StorageInvariants, Guards, Admitting, Invariants, CacheCore):
    """A hierarchical radix prefix cache (device / host / L3 storage tiers) with pluggable
    components.

    Lifetime rules: ``match_prefix`` does not pin anything; lock ``last_device_node`` (or the
    load-back anchor) before using the indices; every lock is released with its receipt.
    With ``storage``, call ``close()`` when done (stops the prefetch worker and the writer).
    """

    def __init__(self, config: CacheConfig, recorder: Recorder | None = None, *,
                 storage=None) -> None:
        """Args:
            config: the cache's shape and policies.
            recorder: where op records and mutations go (nothing is recorded without one).
            storage: a ``storage.StorageSetup`` attaching an L3 tier (None: two tiers).
        """
        if storage is not None:
            from radixscope.cache.storage.setup import StorageSetup
            if not isinstance(storage, StorageSetup):
                raise TypeError(f"storage must be a StorageSetup, got {type(storage).__name__}")
            if not config.has_host:
                raise ValueError("storage needs a host tier (host_tokens > 0)")
        super().__init__(config, recorder)
        self.instance = next(_instances)
        self.request_held = [per_tier(0) for _ in self.comps]
        self.engine = TransferEngine(config.device)
        self.engine.check_pools(self)
        self.prefetcher = None
        self._writer = None
        self._init_prefetch_state()
        if storage is not None:
            self._init_storage(storage)
        if self._on:
            self.recorder.attach(self.info(), self.snapshot())

    # ---- plumbing -------------------------------------------------------------------------
    def info(self) -> dict:
        return {
            "config": self.config.summary(),
            "components": [c.name for c in self.comps],
            "page_size": self.page_size,
            "pools": {f"{c.name}/{t.label}": self.pool(c.index, t).alloc.capacity
                      for c in self.comps for t in self.pool_tiers},
            "bytes_per_slot": {f"{c.name}/{t.label}": self.pool(c.index, t).bytes_per_slot
                               for c in self.comps for t in self.pool_tiers},
            "kernels": native.KERNELS,
            "ledger": ledger.LEDGER,
            "leaf_heap": leaves.LEAF_HEAP,
        } | ({} if self.storage is None else {"storage": {
            "backend": self.storage.backend.name, "write_policy": self.storage.write_policy,
            "prefetch_policy": self.storage.prefetch.policy.value,
            "threshold_tokens": self.storage.prefetch.threshold_tokens}})

    def save_to_host(self, node: Node, cis: set[int] | None = None) -> bool:
        return self._backup_sync(node, cis)

    def _ci_of(self, component: str) -> int:
        ci = self.ci.get(component)
        if ci is None:
            raise ValueError(f"component={component!r} is not configured; have "
                             f"{[c.name for c in self.comps]}")
        return ci

    # ---- insert ---------------------------------------------------------------------------
    # ---- request-private slots -------------------------------------------------------------
    def alloc(self, num: int, *, component: str = BACKBONE, req_id: str | None = None
              ) -> torch.Tensor:
        """Device slots for a request: ``ceil_paged(num)`` KV slots (``num`` states for MAMBA),
        evicting as needed. Raises ``CacheOutOfMemory`` with the numbers when no room can be
        made (nothing is evicted then). Mutates: the pool; evictions."""
        if isinstance(num, bool) or not isinstance(num, int) or num < 0:
            raise ValueError(f"alloc num={num!r} must be an int >= 0")
        ci = self._ci_of(component)
        comp = self.comps[ci]
        need = num if comp.boundary_state else ceil_paged(num, self.page_size)
        # the slots and the component's name as arguments: the op's attributes are those two,
        # read by its native builder (``op_attrs.SPECS``) with no Python frame
        return self._ledger.run(ev.OP_ALLOC, req_id, self._alloc, ci, need, comp.name)

    def _alloc(self, ci: int, need: int, _name: str = "") -> torch.Tensor:
        """``need`` slots (already whole pages; states for MAMBA) for a request, evicting as
        needed. ``_name`` (the component's) is not used here: ``alloc`` passes it for the op's
        attribute builder, which reads it from the arguments."""
        alloc = self.device_pools[ci].alloc
        if alloc.available < need:
            if alloc.available + self.evictable[ci][DEVICE] < need:
                raise self.oom(ci, DEVICE, need)
            self._evict_device(ci, need - alloc.available)
        out = self.take_slots(ci, DEVICE, need)
        if out is None:
            raise self.oom(ci, DEVICE, need, "eviction could not reach the evictable total")
        self.request_held[ci][DEVICE] += need
        return out

    def free(self, indices: torch.Tensor, *, component: str = BACKBONE,
             req_id: str | None = None) -> int:
        """Return request-private device slots (whole pages). A double free, or slots a tree node
        owns (only request-held slots may be freed), raises ValueError naming the slots, before
        anything changes. Returns slots freed."""
        ci = self._ci_of(component)
        if not isinstance(indices, torch.Tensor):
            raise TypeError(f"indices must be a torch.Tensor, got {type(indices).__name__}")
        indices = indices.to("cpu", torch.int64) if indices.dtype == torch.int32 else indices
        alloc = self.device_pools[ci].alloc
        pages = alloc.check_free(indices)
        if self.cow_pending and ci == self.ci.get(STATE):
            busy = [s for s in indices.tolist() if s in self.cow_pending]
            if busy:
                raise ValueError(f"mamba slots {busy} are still being written by load-back "
                                 f"{self.cow_pending[busy[0]]}: poll it before freeing")
        bad = alloc.any_tree_owned(pages)
        if bad:
            raise ValueError(f"{alloc.name}: slots {bad[:8]} are owned by the tree, not held by "
                             "a request: free only what alloc (or a CoW) handed out")
        return self._ledger.run(ev.OP_FREE, req_id, self._free, ci, indices, pages)

    def _free(self, ci: int, indices, pages) -> int:
        n = self.free_slots(ci, DEVICE, indices, pages)
        self.request_held[ci][DEVICE] -= n
        return n

    # ---- eviction / transfers (methods in eviction.py, transfers.py) -----------------------
    def evict(self, num_tokens: int, *, component: str = BACKBONE, req_id: str | None = None):
        """Free at least ``num_tokens`` device slots of ``component`` (LRU). Returns an
        ``EvictResult``. Backed-up leaves become host-only; unbacked ones are deleted (under
        write_back they are backed up first); childless tombstone ancestors are removed up to
        the first locked or host-referenced node. Internal SWA/MAMBA data is tombstoned."""
        _check_amount("num_tokens", num_tokens)
        ci = self._ci_of(component)
        return self._ledger.run(ev.OP_EVICT, req_id, self._evict_device, ci, num_tokens)

    def evict_host(self, num_tokens: int, *, component: str = BACKBONE,
                   req_id: str | None = None):
        """Free at least ``num_tokens`` host slots of ``component`` (LRU over host-only leaves;
        auxiliary host copies on internal nodes are tombstoned). Returns an ``EvictResult``."""
        _check_amount("num_tokens", num_tokens)
        ci = self._ci_of(component)
        return self._ledger.run(ev.OP_EVICT_HOST, req_id, self._evict_host_slots, ci, num_tokens)

    def backup(self, node: int, *, req_id: str | None = None) -> int | None:
        """Start a device -> host copy of ``node`` (and, under write-through, its unbacked
        ancestors). Host values are set at once; the nodes stay locked until the copy is acked
        by ``poll``. Returns the transfer id, or None when nothing needed a copy or the host
        tier had no room."""
        n = self.node(node)
        if not self.config.has_host:
            raise ValueError("backup needs a host tier (host_tokens > 0)")
        tid = self._ledger.run(ev.OP_BACKUP, req_id, self._backup, n)
        return None if tid is None else TransferId(tid, self.instance)

    def load_back(self, match: MatchResult, *, cow_mamba: bool = False,
                  req_id: str | None = None) -> LoadBackResult:
        """Host -> device load anchored on ``match.best_match_node`` (never on another node:
        only there does every component accept the data). Allocates device slots (evicting as
        needed, with the anchor's path pinned), sets the device values, and starts the copy;
        the loaded nodes stay locked until ``poll`` acks it. Raises ``CacheOutOfMemory`` with
        nothing changed when the slots cannot be found."""
        if not isinstance(match, MatchResult):
            raise TypeError(f"load_back takes a MatchResult, got {type(match).__name__}")
        self._check_handle(match, "MatchResult")
        anchor = self.node(match.best_match_node)
        return self._ledger.run(ev.OP_LOAD_BACK, req_id, self._load_back, anchor,
                         bool(cow_mamba))

    def poll(self, transfer_ids=None, *, wait: bool = False) -> list[int]:
        """Ack finished transfers (on CPU: run the queued copies now, in the given order; a
        copy ``match_prefix`` already ran is not repeated). Returns the acked transfer ids. An id
        given twice, unknown, already acked or from another cache raises ValueError naming it,
        before anything is acked. Each ack is recorded as a ``transfer`` op linked to the op
        that enqueued it.

        With storage, a poll of everything (``transfer_ids`` None) also acks finished L3
        stores (all of them with ``wait``; their ids are returned too) and polls the prefetch
        controller once (a collective with several ranks: call it on every rank), handing
        finished prefetches back into the tree (one ``prefetch`` op record each)."""
        if transfer_ids is not None:
            transfer_ids = self._check_poll_ids(transfer_ids)
        out = [TransferId(t, self.instance) for t in self._poll(transfer_ids, wait)]
        if self.storage is not None and self._writer is not None:
            self._start_wanted_stores()
            if transfer_ids is None:
                out += [TransferId(t, self.instance) for t in self._ack_stores(wait)]
                self._poll_prefetch()
                self._start_wanted_stores()  # what the hand-backs asked for
        return out

    def admission(self, match: MatchResult, extend_len: int, chunk_tokens: int | None = None):
        """What admitting a request needs per component, against what is free; see
        ``radixscope.cache.admission.Admission``. ``fits`` is the decision. Read-only."""
        if isinstance(match, MatchResult):
            self._check_handle(match, "MatchResult")
        return self._admission_budget(match, extend_len, chunk_tokens)

    # ---- observation (no recency change, no records) ---------------------------------------
    def check(self) -> None:
        """Raise ``InvariantViolation`` listing every broken invariant; read-only. A violation
        is also handed to ``error_hook`` (a crash bundle) before it propagates."""
        try:
            self._check_invariants()
        except InvariantViolation as e:
            self._after_error(ev.OP_CHECK, e)
            raise

    def violations(self) -> list[tuple[str, int | None, str]]:
        """Every broken invariant as ``(name, node, detail)``; empty when healthy. Read-only,
        never raises for a violation and never calls ``error_hook`` (for observers such as
        crash-bundle writers)."""
        try:
            self._check_invariants()
        except InvariantViolation as e:
            return list(e.violations)
        return []

    def dump_bundle(self, path=None, *, note: str | None = None):
        """Write a crash bundle now (tree, flight-recorder tail, config, pools, metrics).

        Needs a writer installed by ``telemetry.capture.crash.install_crash_bundles(cache, directory)``
        (the cache never imports telemetry). Returns what the writer returns (the path)."""
        if self.bundle_writer is None:
            raise RuntimeError("no bundle writer installed: call "
                               "telemetry.capture.crash.install_crash_bundles(cache, directory)")
        return self.bundle_writer(path, note=note)

    def snapshot(self) -> CacheSnapshot:
        """Plain frozen data of the whole cache at the current seq; read-only."""
        return self._live_snapshot()

    def path_indices(self, node: int, *, component: str = BACKBONE, last: int | None = None
                     ) -> torch.Tensor:
        """A component's device indices along the path root -> ``node`` (read-only).

        ``last=N`` returns only the indices of the last N tokens (e.g. an SWA window); every
        node that range touches must hold the component on device, else ValueError."""
        n = self.node(node)
        ci = self._ci_of(component)
        if self.comps[ci].boundary_state:
            raise ValueError(f"component {component!r} holds one state per node, not a path")
        if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 0):
            raise ValueError(f"last={last!r} must be None or an int >= 0")
        path = self.tree.path_to_root(n)[::-1]
        total = sum(len(x.key) for x in path)
        start = 0 if last is None else max(0, total - last)
        parts, off = [], 0
        for x in path:
            k = len(x.key)
            if off + k > start:
                v = x.data[ci].values[DEVICE]
                if v is None:
                    raise ValueError(f"node {x.id} holds no {component} device data within the "
                                     f"requested range of node {node}'s path")
                parts.append(v[max(0, start - off):])
            off += k
        return torch.cat(parts) if parts else _EMPTY

    def node_prefix_len(self, node: int) -> int:
        return self.tree.prefix_len(self.node(node))

    def available(self, component: str = BACKBONE, tier: str = "device") -> int:
        return self.pool(self._ci_of(component), self._tier_of(tier)).alloc.available

    def evictable_slots(self, component: str = BACKBONE, tier: str = "device") -> int:
        """Slots of ``component`` on ``tier`` held by unlocked tree values (what eviction can
        free): an ``alloc`` of at most ``available() + evictable_slots()`` does not run out of
        memory."""
        return self.evictable[self._ci_of(component)][self._tier_of(tier)]

    def _tier_of(self, tier: str) -> Tier:
        t = self._pool_tier_of.get(tier) if type(tier) is str else None
        if t is None:
            labels = tuple(t.label for t in self.pool_tiers)
            raise ValueError(f"tier={tier!r}: must be one of {labels}")
        return t


def _check_amount(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name}={v!r} must be an int >= 0")


__all__ = ["HiRadixCache"]
