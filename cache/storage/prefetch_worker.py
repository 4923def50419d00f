"""The prefetch worker thread: existence query, FULL pages in batches, then the pool pages.

One thread per controller takes prefetches in start order (so every rank runs its worker-side
collectives in the same order) and, for each, always runs the same three collectives on the
worker's own rank group, whatever happened locally (terminated, failed, nothing to fetch):

1. MIN of the pages storage reports present (``batch_exists``) -> ``target`` (0 when below the
   threshold: nothing is fetched);
2. MIN of the FULL pages landed -> the hit end ``E``;
3. (pools only) MIN of "every pool page at ``E`` landed": all or nothing; on a failure anywhere
   the hit is 0 on every rank.

The worker writes only into the host slots the op was given, never touches an allocator, and
stops fetching at the next batch once the op is terminated. It marks ``worker_done`` last; until
then the controller keeps the op's leftover slots (so nothing it may still write is freed).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import torch

from radixscope.cache.storage import prefetch_events as pe
from radixscope.cache.storage.base import StorageBackend
from radixscope.cache.storage.prefetch_op import PrefetchOp, PrefetchPool
from radixscope.cache.storage.results import BatchResult, PageStatus
from radixscope.cache.storage.tp import RankGroup

log = logging.getLogger("radixscope.cache.storage.prefetch")


class PrefetchWorker:
    """Runs prefetches on one daemon thread. ``submit`` from the controller; ``stop`` to end."""

    def __init__(self, backend: StorageBackend, full: PrefetchPool,
                 aux: tuple[PrefetchPool, ...], group: RankGroup, threshold_pages: int,
                 batch_pages: int, emit: Callable[[str, str | None, dict], None],
                 count: Callable[[Callable[[pe.PrefetchCounters], None]], None]) -> None:
        self.backend = backend
        self.full = full
        self.aux = aux
        self.group = group
        self.threshold_pages = threshold_pages
        self.batch_pages = batch_pages
        self._emit = emit
        self._count = count
        self._q: queue.Queue[PrefetchOp | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="radixscope-prefetch",
                                        daemon=True)
        self._thread.start()

    def submit(self, op: PrefetchOp) -> None:
        self._q.put(op)

    def stop(self, timeout: float = 10.0) -> bool:
        """Finish the queued prefetches (terminate them first) and end the thread."""
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            op = self._q.get()
            if op is None:
                return
            try:
                self._run(op)
            except Exception:  # a bug here must not strand the op: it ends with nothing
                log.exception("prefetch worker failed on %s", op.req_id)
                with op.lock:
                    op.fail_reason = op.fail_reason or "worker_error"
                    op.final, op.aux_ok, op.full_done, op.worker_done = 0, False, True, True

    # ---- one prefetch ----
    def _run(self, op: PrefetchOp) -> None:
        full_slots = op.full_slots           # own references: the controller may replace
        aux_slots = dict(op.aux_slots)       # op's fields with leftovers after a hand-back
        keys = self.full.fingerprint.keys(op.hashes)
        found = 0
        if not self._terminated(op):
            r = self.backend.batch_exists(keys)
            found = r.count
            self._count(lambda c: setattr(c, "exists_calls", c.exists_calls + 1))
            self._emit(pe.STORAGE_EXISTS, op.req_id, pe.attrs(
                pages=len(keys), hit_tokens=r.count * self.full.pages.page_size,
                seconds=r.seconds, status=r.status.value, component=self.full.component,
                backend=self.backend.name))
            if r.status is not PageStatus.OK:
                self._fail(op, r.status.value)
        target = self.group.all_reduce([found], "min")[0]          # collective 1
        if target < self.threshold_pages:
            target = 0
        with op.lock:
            op.target = target
        landed = self._fetch_full(op, keys[:target], full_slots)
        end = self.group.all_reduce([landed], "min")[0]           # collective 2
        ok = True
        if self.aux:
            with op.lock:
                go = not op.terminated and end > 0
            if go:
                ok = all(self._fetch_pool(op, pool, aux_slots[pool.component], end)
                         for pool in self.aux)
            else:
                ok = end == 0
            ok = bool(self.group.all_reduce([int(ok)], "min")[0])  # collective 3
            if not ok and end > 0:
                self._fail(op, pe.R_POOL_TRANSFER)
                end = 0
        with op.lock:
            op.final, op.aux_ok, op.worker_done = end, ok, True

    def _fetch_full(self, op: PrefetchOp, keys: list[str], slots: torch.Tensor) -> int:
        p = self.full.pages.page_size
        for i in range(0, len(keys), self.batch_pages):
            if self._terminated(op):
                break
            chunk = keys[i:i + self.batch_pages]
            r = self.backend.batch_get(chunk, self.full.pages, slots[i * p:(i + len(chunk)) * p])
            self._note_get(op, r, self.full.component)
            k = r.prefix_ok
            with op.lock:
                if not op.terminated:
                    op.completed = i + k
                done = op.completed
            self._emit(pe.PREFETCH_PROGRESS, op.req_id, pe.attrs(completed_tokens=done * p))
            if k < len(chunk):
                self._fail(op, r.statuses[k].value)
                break
        with op.lock:
            op.full_done = True
            return op.completed

    def _fetch_pool(self, op: PrefetchOp, pool: PrefetchPool, slots: torch.Tensor,
                    end: int) -> bool:
        keys = pool.keys_at(op.hashes, end)
        n = len(keys) * pool.pages.page_size
        r = self.backend.batch_get(keys, pool.pages, slots[:n])
        self._note_get(op, r, pool.component)
        return r.all_ok

    # ---- helpers ----
    @staticmethod
    def _terminated(op: PrefetchOp) -> bool:
        with op.lock:
            return op.terminated

    @staticmethod
    def _fail(op: PrefetchOp, reason: str) -> None:
        with op.lock:
            op.fail_reason = op.fail_reason or reason

    def _note_get(self, op: PrefetchOp, r: BatchResult, component: str) -> None:
        bad = r.reasons()

        def upd(c: pe.PrefetchCounters) -> None:
            c.get_calls += 1
            c.bytes_read += r.nbytes
            c.get_seconds += r.seconds
            for k, v in bad.items():
                c.add(c.failed_pages, k, v)

        self._count(upd)
        first_bad = next((s.value for s in r.statuses if not s.ok), "ok")
        self._emit(pe.STORAGE_GET, op.req_id, pe.attrs(
            pages=len(r.statuses), bytes=r.nbytes, seconds=r.seconds, status=first_bad,
            component=component, backend=self.backend.name))
