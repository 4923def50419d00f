"""The store writer: one daemon thread running ``batch_set`` jobs in submission order.

A ``StoreJob`` lists, per component, the storage keys and the host slots holding those pages.
The cache keeps those slots host-pinned until it acks the job (``done`` set), so the writer
reads memory nobody frees or rewrites under it. The writer never touches the tree or an
allocator; a backend failure is a per-page status like any other (``StorageBackend`` turns
exceptions into values), and an unexpected exception marks every page ``error``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from radixscope.cache.storage import prefetch_events as pe
from radixscope.cache.storage.base import StorageBackend
from radixscope.cache.storage.pages import HostPages
from radixscope.cache.storage.results import BatchResult, PageStatus

log = logging.getLogger("radixscope.cache.storage.writer")


@dataclass(frozen=True)
class StorePart:
    """One component's pages of a store: ``keys[i]`` is stored from the page at ``slots``."""

    component: str
    pages: HostPages
    keys: tuple[str, ...]
    slots: torch.Tensor


@dataclass(eq=False)
class StoreJob:
    """A store in flight. ``statuses`` (one tuple per part) is valid once ``done`` is set."""

    tid: int
    parts: tuple[StorePart, ...]
    done: threading.Event = field(default_factory=threading.Event)
    statuses: tuple[tuple[PageStatus, ...], ...] = ()

    def landed(self) -> list[int]:
        """Per part: pages stored contiguously from the first (ok or already stored)."""
        out = []
        for st in self.statuses:
            n = 0
            while n < len(st) and st[n].ok:
                n += 1
            out.append(n)
        return out


class StoreWriter:
    """Runs ``StoreJob``s on one thread, in order. ``close`` finishes the queue and stops.

    Args:
        backend: the L3 store.
        observer: receives one ``storage.set`` event per ``batch_set`` call (its own, and the
            synchronous write-back calls the cache reports through ``emit_set``); a failing
            observer is logged and counted (``observer_errors``), never raised.
    """

    def __init__(self, backend: StorageBackend, observer: pe.PrefetchObserver | None = None
                 ) -> None:
        self.backend = backend
        self.observer = observer or pe.NULL_OBSERVER
        self._obs_on = bool(self.observer.enabled)
        self.observer_errors = 0
        self._obs_lock = threading.Lock()
        self._q: queue.Queue[StoreJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="radixscope-store", daemon=True)
        self._thread.start()

    def submit(self, job: StoreJob) -> None:
        self._q.put(job)

    def close(self, timeout: float = 10.0) -> bool:
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            out = []
            for part in job.parts:
                t0 = time.perf_counter()
                try:
                    r = self.backend.batch_set(list(part.keys), part.pages, part.slots)
                except Exception:  # a bug must not strand the job: its pages count as failed
                    log.exception("store writer failed on transfer %s", job.tid)
                    r = BatchResult((PageStatus.ERROR,) * len(part.keys), 0,
                                    time.perf_counter() - t0)
                out.append(r.statuses)
                self.emit_set(part.component, r)
            job.statuses = tuple(out)
            job.done.set()

    def emit_set(self, component: str, r: BatchResult) -> None:
        """Report one ``batch_set`` call to the observer: ``(storage.set, None, time_ns,
        {pages, bytes, seconds, status (the first non-OK page's, or "ok"), component,
        backend})``. Called from the writer thread and, for write-back, the cache's thread."""
        if not self._obs_on:
            return
        status = next((st.value for st in r.statuses if not st.ok), "ok")
        attrs = pe.attrs(pages=len(r.statuses), bytes=r.nbytes, seconds=r.seconds,
                         status=status, component=component, backend=self.backend.name)
        try:
            self.observer.event((pe.STORAGE_SET, None, time.time_ns(), attrs))
        except Exception:  # telemetry must never break the cache; counted and logged
            with self._obs_lock:
                self.observer_errors += 1
            log.exception("storage observer failed on %s", pe.STORAGE_SET)


__all__ = ["StoreJob", "StorePart", "StoreWriter"]
