"""How a cache is given its L3 tier (``StorageSetup``), and the plain values it reports about
it (``PrefetchState``, ``WriteStats``, ``StorageCacheStats``). No tree here."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from radixscope.cache.storage.base import StorageBackend
from radixscope.cache.storage.prefetch_events import PrefetchObserver, PrefetchStats
from radixscope.cache.storage.prefetch_policy import PrefetchConfig
from radixscope.cache.storage.results import StorageStats
from radixscope.cache.storage.tp import RankGroup, SingleRank

STORE_POLICIES = ("write_through", "write_through_selective", "write_back")


@dataclass(frozen=True)
class StorageSetup:
    """The L3 tier of a ``HiRadixCache``.

    Attributes:
        backend: the store (``open_backend(spec)``, any ``StorageBackend``).
        model: the model id in every key's fingerprint (the rest comes from the config / pools).
        write_policy: ``write_through`` (every acked backup chain is written),
            ``write_through_selective`` (only nodes hit ``write_threshold`` times),
            ``write_back`` (written synchronously right before host eviction drops them).
        write_threshold: hit count for ``write_through_selective``.
        prefetch: the prefetch policy, threshold, budget and rate limit.
        group / io_group: tensor-parallel rank groups (caller thread / prefetch worker);
            ``SingleRank`` by default.
        observer: receives prefetch / storage events (telemetry passes one).
    """

    backend: StorageBackend
    model: str = "radixscope-standin"
    write_policy: str = "write_through"
    write_threshold: int = 2
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    group: RankGroup | None = None
    io_group: RankGroup | None = None
    observer: PrefetchObserver | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.backend, StorageBackend):
            raise TypeError(f"StorageSetup.backend must be a StorageBackend, got "
                            f"{type(self.backend).__name__}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"StorageSetup.model={self.model!r}: must be a non-empty str")
        if self.write_policy not in STORE_POLICIES:
            raise ValueError(f"StorageSetup.write_policy={self.write_policy!r}: must be one "
                             f"of {STORE_POLICIES}")
        t = self.write_threshold
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"StorageSetup.write_threshold={t!r}: must be an int >= 1")
        if not isinstance(self.prefetch, PrefetchConfig):
            raise TypeError(f"StorageSetup.prefetch must be a PrefetchConfig, got "
                            f"{type(self.prefetch).__name__}")
        for name in ("group", "io_group"):
            g = getattr(self, name)
            if g is not None and not callable(getattr(g, "all_reduce", None)):
                raise TypeError(f"StorageSetup.{name} must be a RankGroup, got {g!r}")

    @property
    def rank_group(self) -> RankGroup:
        return self.group or SingleRank()


@dataclass(frozen=True)
class PrefetchState:
    """One request's prefetch, as ``cache.prefetch_state`` / ``pending_prefetches`` report it.

    Attributes:
        req_id: the request.
        status: ``ongoing`` (running), ``done`` (handed back), ``aborted``.
        asked_tokens: tokens asked from L3 (page-aligned, past the host match).
        completed_tokens: tokens landed so far on this rank (``done``: handed back).
        hit_tokens: tokens handed back into the tree (``ongoing``: 0).
        reason: why it ended (a ``prefetch_events`` reason), "" while ongoing.
        started_ns: wall-clock start.
        anchor: the node it is anchored on (host-pinned while ongoing).
        start_len: tokens before the prefetched range (the anchor's prefix length).
        seconds: start to hand-back (0 while ongoing).
    """

    req_id: str
    status: str
    asked_tokens: int
    completed_tokens: int
    hit_tokens: int
    reason: str
    started_ns: int
    anchor: int
    start_len: int
    seconds: float = 0.0


class WriteCounters:
    """The write path's counters (writer thread and scheduler thread; one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.transfers = 0
        self.pages_stored = 0      # pages that landed (ok or already stored)
        self.pages_failed: dict[str, int] = {}
        self.write_back_pages = 0
        self.nodes_stored = 0

    def fail(self, status: str, n: int = 1) -> None:
        with self.lock:
            self.pages_failed[status] = self.pages_failed.get(status, 0) + n

    def freeze(self) -> WriteStats:
        with self.lock:
            return WriteStats(self.transfers, self.pages_stored, dict(self.pages_failed),
                              self.write_back_pages, self.nodes_stored)


@dataclass(frozen=True)
class WriteStats:
    """Store transfers acked, pages that landed, pages that failed per status (``error``,
    ``timeout``, ``full``..., ``peer_rank`` when another rank's page failed), pages written
    synchronously by write_back, nodes that gained a STORAGE value."""

    transfers: int
    pages_stored: int
    pages_failed: dict[str, int]
    write_back_pages: int
    nodes_stored: int

    @property
    def failed(self) -> int:
        return sum(self.pages_failed.values())


@dataclass(frozen=True)
class StorageCacheStats:
    """``cache.storage_stats()``: the backend's counters, the write path's, the prefetch's."""

    backend: StorageStats
    writes: WriteStats
    prefetch: PrefetchStats

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {"backend": asdict(self.backend), "writes": asdict(self.writes),
                "prefetch": asdict(self.prefetch)}


__all__ = ["STORE_POLICIES", "PrefetchState", "StorageCacheStats", "StorageSetup", "WriteCounters",
           "WriteStats"]
