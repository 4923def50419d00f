"""The pieces of a prefetch: the host pools it fills, its handed-back result, its live state.

``PrefetchPool`` names one component's host pool (pages, allocator, key fingerprint) and how
its pages are chosen: ``prefix`` (every page of the hit: FULL), ``window`` (the trailing
``window_pages`` pages ending at the hit end: SWA), ``state`` (one state keyed by the hit's
last page hash: MAMBA). ``PrefetchResult`` is what the caller gets back and then owns.
``PrefetchOp`` is the controller's mutable record of one running prefetch, shared with its
worker thread under ``op.lock`` (never handed out).
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Protocol

import torch

from radixscope.cache.storage.keys import Fingerprint
from radixscope.cache.storage.pages import HostPages

POOL_KINDS = ("prefix", "window", "state")


class HostAllocator(Protocol):
    """Host slots, whole pages (``pools.SlotAllocator`` or a cache adapter that evicts first)."""

    capacity: int

    def alloc(self, num_slots: int) -> torch.Tensor | None: ...

    def free(self, indices: torch.Tensor) -> int: ...


@dataclass(frozen=True)
class PrefetchPool:
    """One component's host pool as the prefetch sees it.

    Attributes:
        component: component name (``full``, ``swa``, ``mamba``...).
        pages: the host buffer as pages (``HostPages.page_size`` slots a page).
        allocator: hands out and takes back host slots of that buffer.
        fingerprint: what the stored bytes mean (makes the keys).
        kind: ``prefix`` (every page of the hit: FULL) | ``window`` | ``state`` (see the module docstring).
        window_pages: for ``window``: pages of the window fetched at the hit end.
    """

    component: str
    pages: HostPages
    allocator: HostAllocator
    fingerprint: Fingerprint
    kind: str = "prefix"
    window_pages: int = 0

    def __post_init__(self) -> None:
        if self.kind not in POOL_KINDS:
            raise ValueError(f"PrefetchPool.kind={self.kind!r}: must be one of {POOL_KINDS}")
        if not isinstance(self.pages, HostPages):
            raise TypeError(f"PrefetchPool.pages must be HostPages, got {type(self.pages)}")
        if self.kind == "window" and (not isinstance(self.window_pages, int)
                                      or self.window_pages < 1):
            raise ValueError(f"window pool {self.component!r}: window_pages="
                             f"{self.window_pages!r} must be an int >= 1")

    def pages_at(self, hit_pages: int) -> int:
        """Pages of this pool fetched for a hit of ``hit_pages`` FULL pages."""
        if self.kind == "prefix":
            return hit_pages
        if hit_pages == 0:
            return 0
        return min(self.window_pages, hit_pages) if self.kind == "window" else 1

    def keys_at(self, hashes: tuple[bytes, ...], hit_pages: int) -> list[str]:
        """Storage keys of this pool's pages for a hit ending at page ``hit_pages``."""
        n = self.pages_at(hit_pages)
        if self.kind == "state":
            return self.fingerprint.keys(hashes[hit_pages - 1:hit_pages]) if n else []
        return self.fingerprint.keys(hashes[hit_pages - n:hit_pages])


@dataclass(frozen=True)
class PrefetchResult:
    """A finished prefetch, handed back once; the caller owns every slot in it.

    Attributes:
        req_id: the request.
        tokens: tokens prefetched (whole pages; identical on every rank).
        page_hashes: the chained hashes of those pages (for the host nodes' storage keys).
        full_slots: FULL host slots holding them, ``tokens`` long.
        aux_slots: ``(component, slots)`` for each other pool, aligned to the hit end (empty
            when ``tokens`` is 0).
        reason: why it ended (``complete``, ``storage_miss``, ``terminated``, ``deadline``,
            ``pool_transfer``, a page status such as ``corrupt``...).
        asked_tokens / hit_tokens: tokens asked for / found in storage (agreed over ranks;
            -1 when the existence query had not run).
        seconds: start to hand-back.
    """

    req_id: str
    tokens: int
    page_hashes: tuple[bytes, ...]
    full_slots: torch.Tensor
    aux_slots: tuple[tuple[str, torch.Tensor], ...]
    reason: str
    asked_tokens: int
    hit_tokens: int
    seconds: float


@dataclass(frozen=True)
class StartResult:
    """Answer of ``start``: ``started``, or why not (``reason``), and the tokens asked for."""

    started: bool
    reason: str
    tokens: int


class Phase(enum.Enum):
    RUNNING = "running"    # the worker may be fetching; the scheduler polls it
    DRAINING = "draining"  # handed back or aborted; the worker still holds its leftover slots
    RELEASED = "released"  # every slot handed back or freed


@dataclass(eq=False)
class PrefetchOp:
    """One prefetch's live state. Fields below ``lock`` are shared with the worker thread."""

    req_id: str
    seq: int
    hashes: tuple[bytes, ...]
    full_slots: torch.Tensor
    aux_slots: dict[str, torch.Tensor]
    has_pools: bool
    t0: float
    budget_s: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    phase: Phase = Phase.RUNNING
    terminated: bool = False
    target: int = -1          # pages storage holds (agreed MIN), -1 before the query
    completed: int = 0        # FULL pages landed on this rank
    full_done: bool = False   # the FULL stage is over on this rank (pool stage may follow)
    final: int = 0            # pages after the agreed FULL MIN and the pool stage
    aux_ok: bool = False      # every pool page landed on every rank
    worker_done: bool = False
    fail_reason: str | None = None

    @property
    def n_pages(self) -> int:
        return len(self.hashes)

    def held(self) -> dict[str, torch.Tensor]:
        """Slots this op still holds, per component (after a hand-back: only the leftovers).
        The worker keeps its own references to the slots it was given; the controller replaces
        these fields with the leftovers when it hands the rest back."""
        if self.phase is Phase.RELEASED:
            return {}
        return {FULL_KEY: self.full_slots, **self.aux_slots}


FULL_KEY = "__full__"  # the FULL pool's entry in ``PrefetchOp.held``
