"""What a prefetch reports: events for spans (start, progress, end, storage calls) and counters
for metrics.

Follows ``cache/events.py``: names and attribute keys are constants here; an observer has an
``enabled`` flag and the controller never calls a disabled one (``NULL_OBSERVER`` costs
nothing); events are plain tuples ``(kind, req_id, time_ns, attrs)`` (``PrefetchEvent`` names
them). Storage events come from the worker thread, the others from the caller's thread; an
observer must be thread-safe. A failing observer is logged and counted, never raised into the
controller. The cache will connect these to its recorder (op records ``prefetch`` with the
request's context; storage calls as child spans).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# ---- event kinds ------------------------------------------------------------------------------
PREFETCH_START = "prefetch.start"        # a prefetch was issued (or declined: attrs[A_REASON])
PREFETCH_PROGRESS = "prefetch.progress"  # a batch landed: completed tokens so far
PREFETCH_END = "prefetch.end"            # handed back: tokens kept, reason, seconds
STORAGE_EXISTS = "storage.exists"
STORAGE_GET = "storage.get"
STORAGE_SET = "storage.set"
EVENT_KINDS = (PREFETCH_START, PREFETCH_PROGRESS, PREFETCH_END, STORAGE_EXISTS, STORAGE_GET,
               STORAGE_SET)

# ---- attribute keys -----------------------------------------------------------------------------
A_REASON = "reason"
A_TOKENS = "tokens"              # tokens asked for (start) / kept (end)
A_HIT_TOKENS = "hit_tokens"      # tokens storage reported present (agreed over ranks)
A_COMPLETED = "completed_tokens"
A_PAGES = "pages"
A_BYTES = "bytes"
A_SECONDS = "seconds"
A_STATUS = "status"              # storage calls: the first non-OK page status, or "ok"
A_COMPONENT = "component"
A_BACKEND = "backend"
A_POLICY = "policy"

# ---- reasons -------------------------------------------------------------------------------------
# declined at start
R_BELOW_THRESHOLD = "below_threshold"
R_RATE_LIMITED = "rate_limited"
R_HOST_CAPACITY = "host_capacity"
# why a prefetch ended with fewer tokens than asked (unfulfilled tokens are counted per reason)
R_COMPLETE = "complete"          # everything storage had landed
R_STORAGE_MISS = "storage_miss"  # storage did not hold the rest (exists count short)
R_TERMINATED = "terminated"      # best_effort: stopped when asked
R_DEADLINE = "deadline"          # timeout policy: past its budget
R_POOL_TRANSFER = "pool_transfer"  # an SWA / MAMBA page failed: all or nothing, hit -> 0
R_ABORTED = "aborted"            # the request was aborted while waiting
R_PEER_RANK = "peer_rank"        # another tensor-parallel rank landed fewer pages (MIN)
# per-page failures (``PageStatus`` values) are reasons too: miss (stale exists), corrupt,
# mismatch, timeout, error


class PrefetchEvent(NamedTuple):
    kind: str
    req_id: str | None
    time_ns: int
    attrs: dict


class PrefetchObserver:
    """Interface the controller reports into. ``enabled=False``: never called."""

    enabled: bool = False

    def event(self, ev: tuple) -> None:
        """One event, a tuple in ``PrefetchEvent`` order."""


class NullObserver(PrefetchObserver):
    """The default: reports nothing, costs nothing."""


NULL_OBSERVER = NullObserver()


class ListObserver(PrefetchObserver):
    """Keeps every event (tests, small runs)."""

    enabled = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[PrefetchEvent] = []

    def event(self, ev: tuple) -> None:
        with self._lock:
            self.events.append(PrefetchEvent._make(ev))

    def of(self, kind: str) -> list[PrefetchEvent]:
        with self._lock:
            return [e for e in self.events if e.kind == kind]


@dataclass
class PrefetchCounters:
    """Metrics-ready counts (a copy is a ``PrefetchStats``). Guarded by the controller's lock.

    ``unfulfilled`` counts tokens asked for but not handed back, per reason; ``declined``
    prefetches not started, per reason; ``failed_pages`` storage pages per non-OK status.
    """

    started: int = 0
    ended: int = 0
    hit_tokens: int = 0
    prefetched_tokens: int = 0
    declined: dict[str, int] = field(default_factory=dict)
    unfulfilled: dict[str, int] = field(default_factory=dict)
    ended_by: dict[str, int] = field(default_factory=dict)
    failed_pages: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    get_seconds: float = 0.0
    exists_calls: int = 0
    get_calls: int = 0
    refused_pool_pending: int = 0

    def add(self, table: dict[str, int], key: str, n: int = 1) -> None:
        if n:
            table[key] = table.get(key, 0) + n

    def freeze(self) -> PrefetchStats:
        return PrefetchStats(self.started, self.ended, self.hit_tokens, self.prefetched_tokens,
                             dict(self.declined), dict(self.unfulfilled), dict(self.ended_by),
                             dict(self.failed_pages), self.bytes_read, self.get_seconds,
                             self.exists_calls, self.get_calls, self.refused_pool_pending)


@dataclass(frozen=True)
class PrefetchStats:
    """A snapshot of ``PrefetchCounters`` (never mutated)."""

    started: int
    ended: int
    hit_tokens: int
    prefetched_tokens: int
    declined: dict[str, int]
    unfulfilled: dict[str, int]
    ended_by: dict[str, int]
    failed_pages: dict[str, int]
    bytes_read: int
    get_seconds: float
    exists_calls: int
    get_calls: int
    refused_pool_pending: int

    @property
    def bandwidth(self) -> float:
        """Bytes/s read from storage into host slots, over the time spent in ``batch_get``."""
        return self.bytes_read / self.get_seconds if self.get_seconds > 0 else 0.0


def attrs(**kw: Any) -> dict:
    """An attribute dict (helper so call sites read as ``attrs(tokens=..., reason=...)``)."""
    return kw
