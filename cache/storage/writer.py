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
from dataclasses import dataclass, field

import torch

from radixscope.cache.storage.base import StorageBackend
from radixscope.cache.storage.pages import HostPages
from radixscope.cache.storage.results import PageStatus

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
    """Runs ``StoreJob``s on one thread, in order. ``close`` finishes the queue and stops."""

    def __init__(self, backend: StorageBackend) -> None:
        self.backend = backend
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
                try:
                    r = self.backend.batch_set(list(part.keys), part.pages, part.slots)
                    out.append(r.statuses)
                except Exception:  # a bug must not strand the job: its pages count as failed
                    log.exception("store writer failed on transfer %s", job.tid)
                    out.append((PageStatus.ERROR,) * len(part.keys))
            job.statuses = tuple(out)
            job.done.set()


__all__ = ["StoreJob", "StorePart", "StoreWriter"]
