"""The recorder the cache records into: one deque append per operation, nothing else.

``TelemetryRecorder`` is a ``FlightRecorder`` whose hot path is a single bounded append of
``(op, mutations)`` to a pending deque. The pipeline's drain thread (``telemetry/pipeline.py``)
takes the pending records in batches, ships them to the sinks and only then copies them into
the flight-recorder rings, so even the rings cost the cache nothing. Side messages (host spans,
events, violations) enter through ``submit`` and leave through the same drain thread.

Overflow: when the pending deque holds ``queue_capacity`` records, ``overflow="block"`` waits up
to ``block_timeout_s`` for the drain thread to make room (keeping the journal lossless) and then
drops; ``overflow="drop"`` drops at once. Every dropped op and mutation is counted in
``health.dropped``. ``record`` never raises.
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from typing import Any

from cache.events import FlightRecorder, Mutation, OpRecord
from telemetry.health import DROP_EVENT, DROP_MUTATION, DROP_OP, Health

OVERFLOW_POLICIES = ("block", "drop")


class TelemetryRecorder(FlightRecorder):
    """Recorder handed to ``HiRadixCache(config, recorder=...)``.

    Args:
        health: shared counters (dropped records, failures).
        queue_capacity: pending records (ops) held before the overflow policy applies.
        overflow: ``"block"`` or ``"drop"`` (see the module docstring).
        block_timeout_s: longest a blocked ``record`` waits for room before dropping.
        ring_capacity: op records kept in the flight-recorder ring (and 4x as many mutations)
            for crash bundles; 0 (the default) keeps none. Off by default: every record a ring
            retains is promoted to the garbage collector's oldest generation and brings the
            next full collection (a scan of the whole heap, on the cache's thread) closer, and
            the store keeps everything anyway.
        capture_context: ask the cache to capture the caller's OTel context per op.
    """

    enabled = True

    def __init__(self, health: Health, queue_capacity: int = 262144, overflow: str = "block",
                 block_timeout_s: float = 2.0, ring_capacity: int = 0,
                 capture_context: bool = True) -> None:
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow={overflow!r}: must be one of {OVERFLOW_POLICIES}")
        if queue_capacity < 1:
            raise ValueError(f"queue_capacity={queue_capacity!r}: must be >= 1")
        if block_timeout_s < 0:
            raise ValueError(f"block_timeout_s={block_timeout_s!r}: must be >= 0")
        if ring_capacity < 0:
            raise ValueError(f"ring_capacity={ring_capacity!r}: must be >= 0")
        super().__init__(capacity=max(1, ring_capacity), capture_context=capture_context)
        self.ring_capacity = ring_capacity
        self.health = health
        self.queue_capacity = queue_capacity
        self.overflow = overflow
        self.block_timeout_s = block_timeout_s
        self.pending: collections.deque[tuple[OpRecord, list]] = collections.deque()
        self.side: collections.deque[tuple] = collections.deque()
        self.attached = threading.Event()
        self.closed = False
        self.last_seq = -1  # highest seq the drain thread has seen
        self._room = threading.Event()
        self.wake = threading.Event()  # set to make the drain thread run now
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _forked(ref))

    # ---- the cache-facing interface -------------------------------------------------------
    def attach(self, info: dict, snapshot: Any) -> None:
        """Remember the cache's config summary and first snapshot; queue them for the sinks."""
        with self.health.guard("attach"):
            if self.attached.is_set():
                raise RuntimeError("recorder is already attached to a cache; use one recorder "
                                   "per cache (the second cache's records are ignored)")
            super().attach(info, snapshot)
            self.last_seq = snapshot.seq
            self.side.append(("attach", self.info, snapshot))
            self.attached.set()

    def record(self, op: OpRecord, mutations: list[tuple]) -> None:
        """The hot path: one append. Never raises."""
        try:
            q = self.pending
            if len(q) < self.queue_capacity:
                q.append((op, mutations))
            else:
                self._overflow(op, mutations)
        except Exception as e:  # noqa: BLE001 - guard point: never raise into the cache
            self.health.fail("record", e)

    def _overflow(self, op: OpRecord, mutations: list[tuple]) -> None:
        if self.overflow == "block" and not self.closed:
            self.wake.set()
            self._room.clear()
            if self._room.wait(self.block_timeout_s) and len(self.pending) < self.queue_capacity:
                self.pending.append((op, mutations))
                return
        self.health.drop(DROP_OP)
        self.health.drop(DROP_MUTATION, len(mutations))

    # ---- side channel (any thread) --------------------------------------------------------
    def submit(self, message: tuple) -> None:
        """Queue a side message (``("span", ReadableSpan)``, ``("event", ...)``...) for the
        drain thread. Dropped and counted when the side queue is full."""
        if len(self.side) >= self.queue_capacity:
            self.health.drop(DROP_EVENT)
            return
        self.side.append(message)

    # ---- drain-thread interface -----------------------------------------------------------
    def take(self, limit: int) -> list[tuple[OpRecord, list]]:
        """Pop up to ``limit`` pending records (oldest first) and signal room to waiters."""
        q = self.pending
        n = min(limit, len(q))
        out = [q.popleft() for _ in range(n)]
        if n:
            self._room.set()
        return out

    def take_side(self, limit: int) -> list[tuple]:
        q = self.side
        return [q.popleft() for _ in range(min(limit, len(q)))]

    def remember(self, batch: list[tuple[OpRecord, list]]) -> None:
        """Copy a shipped batch into the flight-recorder rings (drain thread). The caller's
        context is dropped (it keeps the caller's spans alive and the record GC-tracked)."""
        if not self.ring_capacity:
            return
        cap = self.ops.maxlen or len(batch)
        recent = batch[-cap:]
        with self._lock:
            for op, _muts in recent:
                self.ops.append(op._replace(context=None) if op.context is not None else op)
            for _op, muts in batch[-self.mutations.maxlen:] if self.mutations.maxlen else batch:
                if muts:
                    self.mutations.extend(muts)

    def tail(self, n_ops: int | None = None) -> tuple[list[OpRecord], list[Mutation]]:
        """The flight-recorder rings plus records still pending (for crash bundles)."""
        with self._lock:
            ops = list(self.ops)
            muts = [Mutation._make(m) for m in self.mutations]
            for op, ms in list(self.pending):
                ops.append(op)
                muts.extend(Mutation._make(m) for m in ms)
        if n_ops is not None:
            ops = ops[-n_ops:]
        return ops, muts

    def forked(self) -> None:
        """In a forked child there is no drain thread: drop (and count) instead of queueing
        or blocking."""
        self.closed = True
        self.queue_capacity = 0
        self.overflow = "drop"
        self.pending.clear()
        self.side.clear()

    def current_seq(self) -> int:
        """Best known latest seq: the newest pending op's, else the last drained one."""
        try:
            return max(self.last_seq, self.pending[-1][0].seq_last)
        except IndexError:
            return self.last_seq


def _forked(ref: weakref.ref) -> None:
    rec = ref()
    if rec is not None:
        rec.forked()
