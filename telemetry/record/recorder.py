"""The recorder the cache records into: one tuple and one list append per op.

``TelemetryRecorder`` is a ``FlightRecorder`` whose hot path reduces the caller's context to
its span's ids (``compact_record``), encodes the record with its mutations into ``bytes``
(``encode_one``: marshal) and appends that to a buffer. At every drain, flush and close (the
drain thread's cycle, every ``interval_s``) the buffer is joined into one blob
(``join_encoded``: a header and a ``bytes.join``) and queued on the pending deque; the cache's
thread joins it itself only when it reaches ``encode_batch`` records (a drain thread that
fell behind), so no op pays for queueing the others' records. Encoding as each op ends, rather
than queueing the records' objects until a drain, is deliberate: ``bytes`` are invisible to the
garbage collector, while thousands of queued tuples and lists make it run far more often on
the cache's thread, including full whole-heap passes; the op's tuples die young. Encoding each
record alone costs about its share of a batch (marshal version 2 has no back-references), and
no op pays for encoding the records of others: a batch encoded at once (64 records, ~170 us on
the issue-17 workload) was the p99 of every op with telemetry on. The pipeline's drain thread (``telemetry/record/drain.py``) ships
the blobs in batches and keeps the last of them as the flight-recorder ring (``tail()`` decodes
on demand). Side messages (host spans, events, violations) enter through ``submit``.

Overflow: when ``queue_capacity`` records are buffered or pending, ``overflow="block"`` waits
up to ``block_timeout_s`` for the drain thread to make room (keeping the journal lossless) and
then drops; ``overflow="drop"`` drops at once. Every dropped op and mutation is counted in
``health.dropped``. ``record`` never raises.

Threads: only the cache's thread appends to the buffer; ``seal`` (the cache's thread when the
buffer is full, the drain thread, ``flush``, ``close``) takes a prefix of it under a lock and
queues its blob under the same lock, so blobs are queued in recording order.
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from typing import Any

from radixscope.cache.events import FlightRecorder, Mutation, OpRecord
from radixscope.telemetry.record.drops import DROP_EVENT, DROP_MUTATION, DROP_OP, Health
from radixscope.telemetry.record.encode import (
    _MARSHAL,
    _MARSHAL_VERSION,
    _parent_ids,
    compact_record,
    decode,
    decode_one,
    encode_one,
    join_encoded,
    named_records,
)

OVERFLOW_POLICIES = ("block", "drop")


class TelemetryRecorder(FlightRecorder):
    """Recorder handed to ``HiRadixCache(config, recorder=...)``.

    Args:
        health: shared counters (dropped records, failures).
        queue_capacity: pending records (ops) held before the overflow policy applies.
        overflow: ``"block"`` or ``"drop"`` (see the module docstring).
        block_timeout_s: longest a blocked ``record`` waits for room before dropping.
        ring_capacity: op records (with their mutations) kept after shipping, for ``tail()``
            and crash bundles, at least (whole encoded batches are kept); 0 keeps none. Kept as
            encoded ``bytes``: cheap, and untracked by the garbage collector.
        capture_context: ask the cache to capture the caller's OTel context per op.
        encode_batch: buffered records at which the cache's thread joins and queues them
            itself (the drain thread does it every cycle); 1: each record its own blob.
    """

    enabled = True

    def __init__(self, health: Health, queue_capacity: int = 262144, overflow: str = "block",
                 block_timeout_s: float = 2.0, ring_capacity: int = 4096,
                 capture_context: bool = True, encode_batch: int = 4096) -> None:
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow={overflow!r}: must be one of {OVERFLOW_POLICIES}")
        if queue_capacity < 1:
            raise ValueError(f"queue_capacity={queue_capacity!r}: must be >= 1")
        if block_timeout_s < 0:
            raise ValueError(f"block_timeout_s={block_timeout_s!r}: must be >= 0")
        if ring_capacity < 0:
            raise ValueError(f"ring_capacity={ring_capacity!r}: must be >= 0")
        if encode_batch < 1:
            raise ValueError(f"encode_batch={encode_batch!r}: must be >= 1")
        super().__init__(capacity=max(1, ring_capacity), capture_context=capture_context)
        self.ring_capacity = ring_capacity
        self.health = health
        self.queue_capacity = queue_capacity
        self.overflow = overflow
        self.block_timeout_s = block_timeout_s
        self.encode_batch = encode_batch
        self.pending: collections.deque[tuple[int, bytes]] = collections.deque()  # (records, blob)
        self.queued = 0  # records in ``pending``
        self._buf: list = []  # encoded records not queued yet (``encode_one``; the cache's thread)
        self._buf_lock = threading.Lock()
        self.ring: collections.deque[tuple[int, bytes]] = collections.deque()  # (records, blob)
        self._ring_records = 0
        self.recorded_seq = -1  # seq_last of the newest op recorded
        self._last: list = [(None, (0, 0, 0, False))]  # (caller context, its span's ids): see encode
        self.side: collections.deque[tuple] = collections.deque()
        self.attached = threading.Event()
        self.closed = False
        self.last_seq = -1  # the attach snapshot's seq
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

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        """The hot path: reduce, encode, append (queued by the drain thread, or here once
        ``encode_batch`` records wait). Never raises."""
        try:
            buf = self._buf
            if self.queued + len(buf) < self.queue_capacity:
                # compact_record + encode_one, inline (this runs once per cache op)
                ctx = op[5]
                last = self._last[0]
                parent = last[1] if last[0] is ctx else _parent_ids(ctx, self._last)
                rec = (op[0], op[1], op[2], op[3], op[4], parent, op[6], op[7], op[8], op[9],
                       mutations)
                try:
                    buf.append(_MARSHAL(rec, _MARSHAL_VERSION))
                except ValueError:
                    buf.append(rec)  # joined by join_encoded's fallback
                if len(buf) >= self.encode_batch:
                    self.seal()
            else:
                self._overflow(op, mutations)
            self.recorded_seq = op[7]  # seq_last
        except Exception as e:  # noqa: BLE001 - guard point: never raise into the cache
            self.health.fail("record", e)
            self.health.drop(DROP_OP)
            self.health.drop(DROP_MUTATION, _safe_len(mutations))

    def _overflow(self, op: tuple, mutations: list[tuple]) -> None:
        if self.overflow == "block" and not self.closed:
            self.wake.set()
            self._room.clear()
            if (self._room.wait(self.block_timeout_s)
                    and self.queued + len(self._buf) < self.queue_capacity):
                self._buf.append(encode_one(compact_record(op, mutations, self._last)))
                return
        self.health.drop(DROP_OP)
        self.health.drop(DROP_MUTATION, _safe_len(mutations))

    def seal(self) -> None:
        """Join what the buffer holds into one blob and queue it (any thread)."""
        with self._buf_lock:
            buf = self._buf
            n = len(buf)
            if not n:
                return
            parts = buf[:n]
            del buf[:n]
            blob, lost = join_encoded(parts)
            for rec in lost:
                self.health.fail("record.encode", None, f"op {rec[0]} ({rec[1]}) cannot be "
                                 "encoded")
                self.health.drop(DROP_OP)
                self.health.drop(DROP_MUTATION, _safe_len(rec[10]))
            if len(lost) < n:
                self.pending.append((n - len(lost), blob))
                self.queued += n - len(lost)

    # ---- side channel (any thread) --------------------------------------------------------
    def submit(self, message: tuple) -> None:
        """Queue a side message (``("span", ReadableSpan)``, ``("event", ...)``...) for the
        drain thread. Dropped and counted when the side queue is full."""
        if len(self.side) >= self.queue_capacity:
            self.health.drop(DROP_EVENT)
            return
        self.side.append(message)

    # ---- drain-thread interface -----------------------------------------------------------
    def take(self, limit: int) -> list[tuple[int, bytes]]:
        """Pop pending ``(records, blob)`` entries (oldest first) holding up to about ``limit``
        records (at least one entry) and signal room to waiters."""
        q = self.pending
        out: list[tuple[int, bytes]] = []
        n = 0
        with self._buf_lock:  # ``queued`` is also updated by ``seal``
            while q and (n < limit or not out):
                entry = q.popleft()
                out.append(entry)
                n += entry[0]
            self.queued -= n
        if out:
            self._room.set()
        return out

    def take_side(self, limit: int) -> list[tuple]:
        q = self.side
        return [q.popleft() for _ in range(min(limit, len(q)))]

    def remember(self, batch: list[tuple[int, bytes]]) -> None:
        """Keep shipped ``(records, blob)`` entries in the flight-recorder ring, oldest dropped
        while the rest still hold ``ring_capacity`` records (drain thread)."""
        if not self.ring_capacity:
            return
        ring = self.ring
        with self._buf_lock:  # ``tail`` reads the ring under the same lock
            for entry in batch:
                ring.append(entry)
                self._ring_records += entry[0]
            while ring and self._ring_records - ring[0][0] >= self.ring_capacity:
                self._ring_records -= ring.popleft()[0]

    def tail(self, n_ops: int | None = None) -> tuple[list[OpRecord], list[Mutation]]:
        """The ring, the records not yet shipped and the buffer, decoded: ``OpRecord`` s
        (``context=None``) and their ``Mutation`` s, oldest first (for crash bundles)."""
        with self._buf_lock:
            blobs = [blob for _, blob in list(self.ring) + list(self.pending)]
            buffered = [decode_one(p) for p in self._buf]
        records = [rec for blob in blobs for rec in decode(blob)] + buffered
        if n_ops is not None:
            records = records[-n_ops:] if n_ops > 0 else []
        ops: list[OpRecord] = []
        muts: list[Mutation] = []
        for op, ms in named_records(records):
            ops.append(op)
            muts.extend(Mutation._make(m) for m in ms)
        return ops, muts

    def forked(self) -> None:
        """In a forked child there is no drain thread: drop (and count) instead of queueing
        or blocking."""
        self.closed = True
        self.queue_capacity = 0
        self.overflow = "drop"
        self.pending.clear()
        self.queued = 0
        self._buf.clear()
        self._buf_lock = threading.Lock()  # a lock held by a parent's thread stays held here
        self.side.clear()
        self._last = [(None, (0, 0, 0, False))]

    def current_seq(self) -> int:
        """The latest seq recorded (the attach snapshot's before any op)."""
        return max(self.last_seq, self.recorded_seq)


def _forked(ref: weakref.ref) -> None:
    rec = ref()
    if rec is not None:
        rec.forked()


def _safe_len(x: object) -> int:
    try:
        return len(x)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - only for counting what a failed record lost
        return 0
