"""``PrefetchController``: L3 -> host prefetch for waiting requests, agreed over TP ranks.

How the cache calls it (all calls from the scheduler thread, and with several tensor-parallel
ranks, on every rank in the same order with the same arguments -- they make collectives):

- ``start(req_id, page_hashes)`` when a request enters the waiting queue, with the chained
  hashes of the whole pages past its host match (``keys.page_hashes(..., prior=last host
  hash)``). Declines (a value, no collective) below ``threshold_tokens``; clamps to the rate
  limit; allocates every host slot up front (FULL for all pages, the SWA window, one MAMBA
  state) on this thread; all-reduces "allocated" with MIN so every rank starts or none does.
- ``poll()`` once per scheduling step: votes MAX over ``[not can_terminate, terminated]`` per
  running prefetch, then MIN of the landed pages for those that stop, and returns their
  ``PrefetchResult``s. A request whose prefetch is still ``ongoing`` is not scheduled this step.
  The caller owns a result's slots: it turns them into host nodes (or frees them).
- ``abort(req_id)`` when a waiting request is aborted: everything is released.

Lifetime: slots the worker may still write are never freed under it: a prefetch handed back
(or aborted) while its worker runs keeps its leftover slots (``draining``) until the worker is
done, then the next ``poll`` frees them. The allocators are touched only from the caller's
thread. Never terminated while pool transfers are pending (``prefetch_policy.can_terminate``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch

from radixscope.cache.errors import InvariantViolation
from radixscope.cache.storage import prefetch_events as pe
from radixscope.cache.storage.base import StorageBackend
from radixscope.cache.storage.keys import HASH_BYTES
from radixscope.cache.storage.prefetch_op import (
    FULL_KEY,
    Phase,
    PrefetchOp,
    PrefetchPool,
    PrefetchResult,
    StartResult,
)
from radixscope.cache.storage.prefetch_policy import LocalView, PrefetchConfig, can_terminate
from radixscope.cache.storage.prefetch_worker import PrefetchWorker
from radixscope.cache.storage.tp import RankGroup, SingleRank

log = logging.getLogger("radixscope.cache.storage.prefetch")


class PrefetchController:
    """Prefetches pages from ``backend`` into host pools for waiting requests.

    Args:
        backend: the L3 store (any ``StorageBackend``; failures come back as values).
        full: the FULL host pool (``kind="prefix"``: every page of the hit).
        aux: other components' pools (``window`` for SWA, ``state`` for MAMBA), fetched after
            FULL, aligned to the hit end, all or nothing.
        config: policy, threshold, timeout budget, rate limit, batch size.
        group / io_group: rank groups for the caller's thread and the worker thread (two
            distinct groups when ``world_size > 1``; ``SingleRank`` by default).
        observer: receives ``prefetch_events`` events (``NULL_OBSERVER`` by default).
        clock: monotonic seconds (tests may pass a fake one).
    """

    def __init__(self, backend: StorageBackend, full: PrefetchPool,
                 aux: Sequence[PrefetchPool] = (), config: PrefetchConfig | None = None, *,
                 group: RankGroup | None = None, io_group: RankGroup | None = None,
                 observer: pe.PrefetchObserver | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(backend, StorageBackend):
            raise TypeError(f"backend must be a StorageBackend, got {type(backend).__name__}")
        if not isinstance(full, PrefetchPool) or full.kind != "prefix":
            raise ValueError(f"full must be a PrefetchPool of kind 'prefix', got {full!r}")
        aux = tuple(aux)
        for pool in aux:
            if not isinstance(pool, PrefetchPool) or pool.kind == "prefix":
                raise ValueError(f"aux pools must be 'window' or 'state' pools, got {pool!r}")
            if pool.kind == "window" and pool.pages.page_size != full.pages.page_size:
                raise ValueError(f"window pool {pool.component!r}: page_size "
                                 f"{pool.pages.page_size} != FULL page_size "
                                 f"{full.pages.page_size}")
        names = [full.component] + [p.component for p in aux]
        if len(set(names)) != len(names):
            raise ValueError(f"pool components must be distinct, got {names}")
        group = group or SingleRank()
        io_group = io_group or (group if group.world_size == 1 else None)
        if io_group is None or (group.world_size > 1 and io_group is group):
            raise ValueError("with several ranks, pass a distinct io_group for the worker thread")
        self.backend, self.full, self.aux = backend, full, aux
        self.config = config or PrefetchConfig()
        self._can_terminate = can_terminate  # this rank's vote (the one stop rule)
        self.group, self.io_group = group, io_group
        self.observer = observer or pe.NULL_OBSERVER
        self._obs_on = bool(self.observer.enabled)
        self.observer_errors = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._counters = pe.PrefetchCounters()
        self._ops: dict[str, PrefetchOp] = {}   # running, in start order
        self._draining: list[PrefetchOp] = []
        self._seq = 0
        self.page_size = full.pages.page_size
        self.limit_tokens = int(self.config.max_host_share * full.allocator.capacity)
        self._worker = PrefetchWorker(backend, full, aux, io_group,
                                      -(-self.config.threshold_tokens // self.page_size),
                                      self.config.batch_pages, self._emit, self._count)

    # ---- queries ----
    def ongoing(self, req_id: str) -> bool:
        """Whether ``req_id`` has a prefetch not yet handed back (do not schedule it)."""
        return req_id in self._ops

    def completed_tokens(self, req_id: str) -> int:
        """Tokens landed so far on this rank (0 if none is running)."""
        op = self._ops.get(req_id)
        if op is None:
            return 0
        with op.lock:
            return op.completed * self.page_size

    @property
    def occupied_tokens(self) -> int:
        """FULL host tokens held by prefetches (running and draining): the rate-limit ledger."""
        return sum(op.full_slots.numel() for op in self._live())

    def stats(self) -> pe.PrefetchStats:
        with self._lock:
            return self._counters.freeze()

    # ---- operations ----
    def start(self, req_id: str, page_hashes: Sequence[bytes]) -> StartResult:
        """Start prefetching the pages of ``page_hashes`` for ``req_id``.

        Returns:
            ``StartResult``: started, or the reason it was declined (``below_threshold``,
            ``rate_limited``, ``host_capacity``), with the tokens asked for.
        Mutates: allocates host slots; queues the prefetch for the worker.
        Emits: ``prefetch.start``.
        """
        if not isinstance(req_id, str) or not req_id:
            raise TypeError(f"req_id must be a non-empty str, got {req_id!r}")
        if req_id in self._ops:
            raise ValueError(f"req_id {req_id!r} already has a prefetch running")
        hashes = tuple(page_hashes)
        if not all(isinstance(h, bytes) and len(h) == HASH_BYTES for h in hashes):
            raise ValueError(f"page_hashes must be {HASH_BYTES}-byte digests")
        p, threshold = self.page_size, self.config.threshold_tokens
        asked = len(hashes) * p
        if asked == 0 or asked < threshold:
            return self._decline(req_id, pe.R_BELOW_THRESHOLD, asked)
        room = max(0, self.limit_tokens - self.occupied_tokens) // p
        n = min(len(hashes), room)
        if self.group.world_size > 1:  # ranks free drained slots at different polls: agree
            n = self.group.all_reduce([n], "min")[0]  # (and every rank runs this collective)
        if n == 0 or n * p < threshold:
            return self._decline(req_id, pe.R_RATE_LIMITED, asked)
        hashes = hashes[:n]
        got: list[tuple[PrefetchPool, torch.Tensor | None]] = [
            (self.full, self.full.allocator.alloc(n * p))]
        got += [(pool, pool.allocator.alloc(pool.pages_at(n) * pool.pages.page_size))
                for pool in self.aux]
        ok = all(s is not None for _, s in got)
        if not self.group.all_reduce([int(ok)], "min")[0]:     # every rank starts, or none
            for pool, s in got:
                if s is not None:
                    pool.allocator.free(s)
            return self._decline(req_id, pe.R_HOST_CAPACITY, asked)
        self._seq += 1
        op = PrefetchOp(req_id, self._seq, hashes, got[0][1],  # type: ignore[arg-type]
                        {pool.component: s for pool, s in got[1:]},  # type: ignore[misc]
                        bool(self.aux), self._clock(), self.config.budget_s(n, p))
        self._ops[req_id] = op
        self._count(lambda c: setattr(c, "started", c.started + 1))
        self._emit(pe.PREFETCH_START, req_id, pe.attrs(tokens=n * p, reason="started",
                                                      policy=self.config.policy.value))
        self._worker.submit(op)
        return StartResult(True, "started", n * p)

    def poll(self) -> tuple[PrefetchResult, ...]:
        """One scheduling step: hand back every prefetch all ranks agree may stop.

        Collectives (always, on every rank): MAX of ``[n, -n]`` (ranks must run the same
        prefetches: a divergence raises RuntimeError on every rank instead of hanging); when
        ``n > 0``, MAX of ``[not can_terminate, terminated]`` per prefetch; when any stops, MIN
        of ``[landed pages, pools landed]`` per stopping prefetch.

        Returns: the results, in start order. Mutates: frees the leftovers of finished and
        draining prefetches. Emits: ``prefetch.end`` per result.
        """
        self._reap()
        live = list(self._ops.values())
        n = len(live)
        hi, neg_lo = self.group.all_reduce([n, -n], "max")
        if hi != -neg_lo:
            raise RuntimeError(f"prefetch: ranks diverged: between {-neg_lo} and {hi} running "
                               f"prefetches (this rank: {n}); every rank must start, poll and "
                               "abort the same requests")
        if n == 0:
            return ()
        votes: list[int] = []
        whys: list[str] = []
        views: list[LocalView] = []
        now = self._clock()
        for op in live:
            with op.lock:
                view = LocalView(op.worker_done, op.full_done, op.has_pools, now - op.t0,
                                 op.budget_s)
                term = op.terminated
            views.append(view)
            ok, why = self._can_terminate(self.config.policy, view)
            if why == "pool_pending":
                self._count(lambda c: setattr(c, "refused_pool_pending",
                                              c.refused_pool_pending + 1))
            votes += [0 if ok else 1, int(term)]
            whys.append(why)
        red = self.group.all_reduce(votes, "max")
        stop = [i for i in range(n) if red[2 * i] == 0 or red[2 * i + 1] == 1]
        if not stop:
            return ()
        self._check_stop(live, views, stop)
        vals: list[int] = []
        for i in stop:
            op = live[i]
            with op.lock:
                op.terminated = True
                pages, aux = (op.final, op.aux_ok) if op.worker_done else (op.completed, False)
            vals += [pages, int(aux or not op.has_pools)]
        red = self.group.all_reduce(vals, "min")
        return tuple(self._hand_back(live[i], red[2 * j], bool(red[2 * j + 1]), whys[i])
                     for j, i in enumerate(stop))

    def abort(self, req_id: str) -> bool:
        """Release everything of ``req_id``'s prefetch (the request left the waiting queue).

        Returns: whether one was running. Mutates: frees its slots (or drains them once the
        worker is done). Emits: ``prefetch.end`` with reason ``aborted``.
        """
        op = self._ops.pop(req_id, None)
        if op is None:
            return False
        with op.lock:
            op.terminated = True
        self._end(op, 0, pe.R_ABORTED, 0)
        self._release(op)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Abort every prefetch and stop the worker (every rank, like ``abort``)."""
        for req_id in list(self._ops):
            self.abort(req_id)
        self._worker.stop(timeout)
        self._reap()

    def check(self) -> None:
        """Every host slot the controller holds belongs to one live prefetch, is allocated, and
        is held once; running prefetches hold whole allocations. Raises ``InvariantViolation``
        listing every problem. Mutates nothing."""
        bad: list[tuple[str, int | None, str]] = []
        pools = {FULL_KEY: self.full, **{p.component: p for p in self.aux}}
        seen: dict[str, dict[int, str]] = {k: {} for k in pools}
        for op in self._ops.values():
            if op.phase is not Phase.RUNNING:
                bad.append(("prefetch.phase", op.seq, f"{op.req_id} listed running but {op.phase}"))
            if op.full_slots.numel() != op.n_pages * self.page_size:
                bad.append(("prefetch.full_slots", op.seq, f"{op.req_id}: "
                            f"{op.full_slots.numel()} slots for {op.n_pages} pages"))
        for op in self._draining:
            if op.phase is not Phase.DRAINING:
                bad.append(("prefetch.phase", op.seq, f"{op.req_id} draining but {op.phase}"))
        for op in self._live():
            for key, slots in op.held().items():
                pool = pools.get(key)
                if pool is None:
                    bad.append(("prefetch.pool", op.seq, f"{op.req_id} holds unknown {key!r}"))
                    continue
                is_used = getattr(pool.allocator, "is_used", None)
                ps = getattr(pool.allocator, "page_size", 1)
                for s in slots.tolist():
                    other = seen[key].setdefault(s, op.req_id)
                    if other != op.req_id:
                        bad.append(("prefetch.slot_twice", op.seq, f"{key} slot {s} held by "
                                    f"{other} and {op.req_id}"))
                    if is_used is not None and not is_used(s // ps):
                        bad.append(("prefetch.slot_free", op.seq, f"{key} slot {s} held by "
                                    f"{op.req_id} but free in the allocator"))
        if bad:
            raise InvariantViolation(bad)

    # ---- internals ----
    def _check_stop(self, live: list[PrefetchOp], views: list[LocalView], stop: list[int]
                    ) -> None:
        """The stop rule again, at the commit and independent of the vote: no prefetch whose
        pool transfers this rank sees pending may stop (a wrong local rule or a wrong peer
        vote would). Raises ``InvariantViolation`` (``req_ids``: the prefetches) first."""
        bad = [("prefetch.terminated_pool_pending", live[i].seq,
                f"{live[i].req_id}: the vote stopped it while its pool transfers are pending "
                "(FULL landed, the SWA / MAMBA pages at its end not yet)")
               for i in stop if views[i].pool_pending]
        if bad:
            (err := InvariantViolation(bad)).req_ids = tuple(
                live[i].req_id for i in stop if views[i].pool_pending)
            raise err

    def _live(self) -> list[PrefetchOp]:
        return [*self._ops.values(), *self._draining]

    def _decline(self, req_id: str, reason: str, asked: int) -> StartResult:
        def upd(c: pe.PrefetchCounters) -> None:
            c.add(c.declined, reason)
            c.add(c.unfulfilled, reason, asked)

        self._count(upd)
        self._emit(pe.PREFETCH_START, req_id, pe.attrs(tokens=asked, reason=reason,
                                                      policy=self.config.policy.value))
        return StartResult(False, reason, asked)

    def _hand_back(self, op: PrefetchOp, pages: int, aux_ok: bool, why: str) -> PrefetchResult:
        p = self.page_size
        keep = pages if (aux_ok or not op.has_pools) else 0
        with op.lock:
            target, fail = op.target, op.fail_reason
        if keep == op.n_pages:
            reason = pe.R_COMPLETE
        elif why in (pe.R_TERMINATED, pe.R_DEADLINE):
            reason = why
        else:
            reason = fail or (pe.R_STORAGE_MISS if 0 <= target < op.n_pages else pe.R_PEER_RANK)
        aux_keep: list[tuple[str, torch.Tensor]] = []
        aux_left: dict[str, torch.Tensor] = {}
        for pool in self.aux:
            s = op.aux_slots[pool.component]
            k = pool.pages_at(keep) * pool.pages.page_size
            aux_keep.append((pool.component, s[:k]))
            aux_left[pool.component] = s[k:]
        result = PrefetchResult(op.req_id, keep * p, op.hashes[:keep], op.full_slots[:keep * p],
                                tuple(aux_keep), reason, op.n_pages * p,
                                target * p if target >= 0 else -1, self._clock() - op.t0)
        with op.lock:
            op.full_slots, op.aux_slots = op.full_slots[keep * p:], aux_left
        del self._ops[op.req_id]
        self._end(op, keep, reason, target)
        self._release(op)
        return result

    def _end(self, op: PrefetchOp, keep: int, reason: str, target: int) -> None:
        p = self.page_size
        miss = (op.n_pages - target) if target >= 0 and reason != pe.R_ABORTED else 0

        def upd(c: pe.PrefetchCounters) -> None:
            c.ended += 1
            c.add(c.ended_by, reason)
            c.hit_tokens += max(target, 0) * p
            c.prefetched_tokens += keep * p
            c.add(c.unfulfilled, pe.R_STORAGE_MISS, miss * p)
            c.add(c.unfulfilled, reason, (op.n_pages - keep - miss) * p)

        self._count(upd)
        self._emit(pe.PREFETCH_END, op.req_id, pe.attrs(
            tokens=keep * p, reason=reason, hit_tokens=max(target, 0) * p,
            seconds=self._clock() - op.t0, policy=self.config.policy.value))

    def _release(self, op: PrefetchOp) -> None:
        """Free ``op``'s leftovers now if its worker is done, else once it is (``_reap``)."""
        with op.lock:
            done = op.worker_done
        if done:
            self._free(op)
        else:
            op.phase = Phase.DRAINING
            self._draining.append(op)

    def _reap(self) -> None:
        keep = []
        for op in self._draining:
            with op.lock:
                done = op.worker_done
            if done:
                self._free(op)
            else:
                keep.append(op)
        self._draining = keep

    def _free(self, op: PrefetchOp) -> None:
        pools = {FULL_KEY: self.full, **{p.component: p for p in self.aux}}
        for key, slots in op.held().items():
            if slots.numel():
                pools[key].allocator.free(slots)
        op.phase = Phase.RELEASED

    def _count(self, fn: Callable[[pe.PrefetchCounters], None]) -> None:
        with self._lock:
            fn(self._counters)

    def _emit(self, kind: str, req_id: str | None, attrs: dict) -> None:
        if not self._obs_on:
            return
        try:
            self.observer.event((kind, req_id, time.time_ns(), attrs))
        except Exception:  # telemetry must never break the cache; counted and logged
            with self._lock:
                self.observer_errors += 1
            log.exception("prefetch observer failed on %s", kind)
