"""A flight recorder whose window always starts at an exact keyframe.

``radixscope.cache.events.FlightRecorder`` keeps the snapshot the cache gave at ``attach`` and bounded rings
of the latest op records and mutations. Once the mutation ring wraps, the attach snapshot plus
the ring no longer rebuild anything: the mutations between them are gone. A crash bundle then
holds the tree at the failure only.

``KeyframedFlightRecorder`` closes that gap. Mutations leaving the ring are first replayed into
a ``RingBase`` (a ``SnapshotBuilder`` started from the attach snapshot), so ``window()`` returns
the exact state just before the oldest retained mutation together with the rings: every seq in
the window can be rebuilt, which is what ``state_at`` over a bundle needs.

Cost: nothing extra per op until the ring is full; after that each mutation is replayed once,
in chunks of ``trim_chunk`` (bounded pauses; amortised cost in ``bench/bench_postmortem.py``).
``RingBase`` is the reusable part: any recorder that fills its rings elsewhere (the telemetry
drain thread) can feed it the mutations it drops.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from radixscope.cache.events import FlightRecorder, Mutation, OpRecord, named_op
from radixscope.cache.snapshot import CacheSnapshot, SnapshotBuilder


class RingBase:
    """The replayed state just before the oldest mutation a bounded ring still holds.

    Args:
        start: the snapshot the cache gave at ``attach``.
    """

    def __init__(self, start: CacheSnapshot) -> None:
        self._builder = SnapshotBuilder(start)
        self._start = start
        self._dirty = False

    @property
    def seq(self) -> int:
        """The seq of the state ``snapshot()`` returns (the last mutation dropped)."""
        return self._builder.seq

    def advance(self, dropped: Iterable[tuple]) -> None:
        """Replay mutations that are leaving the ring (oldest first)."""
        for m in dropped:
            self._builder.apply(m)
            self._dirty = True

    def snapshot(self) -> CacheSnapshot:
        """The state at ``seq`` (the attach snapshot itself until anything was dropped)."""
        return self._builder.snapshot() if self._dirty else self._start


class KeyframedFlightRecorder(FlightRecorder):
    """``FlightRecorder`` that keeps a ``RingBase`` in step with its mutation ring.

    Args:
        capacity: op records kept; the mutation ring keeps ``4 * capacity`` mutations (as in
            ``FlightRecorder``).
        capture_context: capture the caller's OTel context per op.
        trim_chunk: mutations replayed into the base at a time once the ring is full
            (default: an eighth of the mutation ring, at most 4096).

    Raises:
        ValueError: ``capacity`` or ``trim_chunk`` below 1.
    """

    def __init__(self, capacity: int = 65536, capture_context: bool = True,
                 trim_chunk: int | None = None) -> None:
        super().__init__(capacity=capacity, capture_context=capture_context)
        self.mutation_capacity = capacity * 4
        chunk = min(4096, max(1, self.mutation_capacity // 8)) if trim_chunk is None else trim_chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"trim_chunk={trim_chunk!r}: must be an int >= 1")
        self.trim_chunk = chunk
        self.mutations: collections.deque[tuple] = collections.deque()  # trimmed by hand
        self.base: RingBase | None = None

    def attach(self, info: dict, snapshot: Any) -> None:
        super().attach(info, snapshot)
        self.base = RingBase(snapshot)

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        self.ops.append(op)
        if mutations:
            self.mutations.extend(mutations)
            if len(self.mutations) > self.mutation_capacity:
                self._trim()

    def _trim(self) -> None:
        muts = self.mutations
        n = len(muts) - self.mutation_capacity + self.trim_chunk
        with self._lock:
            dropped = [muts.popleft() for _ in range(min(n, len(muts)))]
            if self.base is not None:
                self.base.advance(dropped)

    def window(self, n_ops: int | None = None
               ) -> tuple[CacheSnapshot | None, list[OpRecord], list[Mutation]]:
        """The exact state before the oldest retained mutation, and the rings.

        Returns:
            ``(start, ops, mutations)``: replaying ``mutations`` onto ``start`` rebuilds every
            seq up to the newest one recorded. ``start`` is None before ``attach``.
        """
        with self._lock:
            start = self.base.snapshot() if self.base is not None else None
            ops = [named_op(o) for o in self.ops]
            muts = [Mutation._make(m) for m in self.mutations]
        if n_ops is not None:
            ops = ops[-n_ops:]
        return start, ops, muts
