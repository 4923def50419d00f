"""The recorder the cache records into: one call per op, one buffer append.

``TelemetryRecorder`` is a ``FlightRecorder`` whose hot path reduces the caller's context to its
span's ids (``compact_record``) and appends the record with its mutations, encoded as ``marshal``
version 2 encodes it, to a buffer. Where the native encoder was built (``telemetry/record/sink.py``:
``ENCODER == "native"``) the cache calls a C ``Sink`` that does all of that in one call, with no
Python object made per record; otherwise ``record`` below does it in Python (``encode_one``:
marshal). At every drain, flush and close (the drain thread's cycle, every ``interval_s``) the
buffer becomes one blob, queued on the pending deque: the sink's own batch (``Sink.take_batch``: one
copy, made with the GIL released) when every record is the sink's, else the parts joined
(``join_encoded``: a header and a ``bytes.join``). The cache's thread never joins: every
``encode_batch`` records it wakes the drain thread (``wake``) and goes on, so no op pays for
queueing the others' records, nor for the fresh memory a blob of megabytes is copied into (a join of
4096 records on the cache's thread made two ~3 MB copies into new pages: up to 1,000 page faults, 12
ms of one op's CPU time on this project's machines). The sink keeps its buffer from one batch to the
next, so the pages it writes into stay mapped (a burst's, grown past 16 MB, is given back).
Encoding as each op ends, rather than queueing the records' objects until a drain, is deliberate:
``bytes`` are invisible to the garbage collector, while thousands of queued tuples and lists make it
run far more often on the cache's thread, including full whole-heap passes; the op's tuples die
young. Encoding each record alone costs about its share of a batch (marshal version 2 has no
back-references), and no op pays for encoding the records of others: a batch encoded at once (64
records, ~170 us on the issue-17 workload) was the p99 of every op with telemetry on. The pipeline's
drain thread (``telemetry/record/drain.py``) ships the blobs in batches and keeps the last of them
as the flight-recorder ring (``tail()`` decodes on demand). Side messages (host spans, events,
violations) enter through ``submit``.

Overflow: when ``queue_capacity`` records are buffered or pending, ``overflow="block"`` waits
up to ``block_timeout_s`` for the drain thread to make room (keeping the journal lossless) and
then drops; ``overflow="drop"`` drops at once. Every dropped op and mutation is counted in
``health.dropped``. ``record`` never raises. The sink checks one number per call (``limit``:
records its buffer may still take) and hands everything else back to the methods here: a full
buffer (``_full``), a record it cannot encode (``_fallback``: the Python path, which pickles
what marshal cannot take), a context it has not seen last (``_parent_of``).

Threads: only the cache's thread appends to the buffer; ``seal`` (the cache's thread when the
buffer is full, the drain thread, ``flush``, ``close``) takes it under a lock and queues its
blob under the same lock, so blobs are queued in recording order. Records the Python path
appends while a sink is in use (``_fallback``, ``_overflow``) first move the sink's buffer aside
under that lock (``_move_sink``), so the buffer's parts stay in recording order too.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from typing import Any

from radixscope.cache.events import FlightRecorder, Mutation, OpRecord
from radixscope.telemetry.record.drops import DROP_EVENT, DROP_MUTATION, DROP_OP, Health
from radixscope.telemetry.record.encode import (
    _MARSHAL,
    _MARSHAL_VERSION,
    Chunk,
    _parent_ids,
    compact_record,
    decode,
    encode_one,
    join_encoded,
    named_records,
    part_records,
)
from radixscope.telemetry.record.sink import ENCODER, Sink

OVERFLOW_POLICIES = ("block", "drop")
ENCODERS = ("native", "python")


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
        encode_batch: buffered records at which the cache's thread wakes the drain thread to
            join and queue them (before its ``interval_s``); it wakes it again at every
            multiple.
        encoder: ``"native"`` (the C ``Sink``; the default where it was built) or
            ``"python"``; both write the same bytes.
    """

    enabled = True

    def __init__(self, health: Health, queue_capacity: int = 262144, overflow: str = "block",
                 block_timeout_s: float = 2.0, ring_capacity: int = 4096,
                 capture_context: bool = True, encode_batch: int = 4096,
                 encoder: str = ENCODER) -> None:
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
        if encoder not in ENCODERS:
            raise ValueError(f"encoder={encoder!r}: must be one of {ENCODERS}")
        if encoder == "native" and Sink is None:
            raise ValueError("encoder='native': the native encoder was not built (or "
                             "RADIXSCOPE_NATIVE=0); use encoder='python'")
        super().__init__(capacity=max(1, ring_capacity), capture_context=capture_context)
        self.ring_capacity = ring_capacity
        self.health = health
        self.overflow = overflow
        self.block_timeout_s = block_timeout_s
        self._encode_batch = encode_batch
        self.encoder = encoder
        self.pending: collections.deque[tuple[int, bytes]] = collections.deque()  # (records, blob)
        self.queued = 0  # records in ``pending``
        # encoded records not queued yet, oldest first (the cache's thread appends): ``bytes``
        # (one record), a tuple (one record marshal cannot take), a ``Chunk`` (the sink's)
        self._parts: list = []
        self._chunked = 0  # records in ``_parts``' chunks beyond one each (under ``_buf_lock``)
        self._buf_lock = threading.Lock()
        self.ring: collections.deque[tuple[int, bytes]] = collections.deque()  # (records, blob)
        self._ring_records = 0
        self._recorded_seq = -1  # seq_last of the newest op recorded on the Python path
        self._last: list = [(None, (0, 0, 0, False))]  # (caller context, its span's ids): see encode
        self._sink = None
        if encoder == "native":
            self._sink = Sink(self._full, self._fallback, self._parent_of)
            self.record = self._sink  # what the cache calls: the C hot path
        self.queue_capacity = queue_capacity  # sets the sink's limit
        self.side: collections.deque[tuple] = collections.deque()
        self.attached = threading.Event()
        self.closed = False
        self.last_seq = -1  # the attach snapshot's seq
        self._room = threading.Event()
        self.wake = threading.Event()  # set to make the drain thread run now
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _forked(ref))

    @property
    def queue_capacity(self) -> int:
        return self._capacity

    @queue_capacity.setter
    def queue_capacity(self, value: int) -> None:
        """Also set when the pipeline closes (0: later records are dropped and counted)."""
        self._capacity = value
        self._set_limit()

    @property
    def encode_batch(self) -> int:
        """Records buffered a batch: the cache's thread wakes the drain thread at each multiple."""
        return self._encode_batch

    @encode_batch.setter
    def encode_batch(self, value: int) -> None:
        """Takes effect from the next record: the sink's limit is set again at once (set from
        the cache's thread, or with the cache idle)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"encode_batch={value!r}: must be an int >= 1")
        self._encode_batch = value
        with self._buf_lock:
            self._set_limit()

    @property
    def recorded_seq(self) -> int:
        """seq_last of the newest op recorded (-1 before any)."""
        sink = self._sink
        return self._recorded_seq if sink is None else max(self._recorded_seq,
                                                            sink.recorded_seq)

    def buffered(self) -> int:
        """Records encoded and not queued yet."""
        return len(self._parts) + self._chunked + (0 if self._sink is None else self._sink.n)

    def _set_limit(self) -> None:
        """The records the sink may still take before it calls ``_full``: up to the next
        multiple of ``encode_batch`` records buffered (where the drain thread is woken), and no
        more than the capacity leaves (callers hold ``_buf_lock``, or own the recorder)."""
        sink = self._sink
        if sink is not None:
            held = len(self._parts) + self._chunked
            batch = self._encode_batch
            due = (held + sink.n) // batch * batch + batch
            sink.limit = min(due, self._capacity - self.queued) - held

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
        """The hot path on the Python encoder (the native one replaces this method on the
        instance): reduce, encode, append (queued by the drain thread, woken every
        ``encode_batch`` records). Never raises."""
        try:
            parts = self._parts
            if self.queued + len(parts) + self._chunked < self._capacity:
                # compact_record + encode_one, inline (this runs once per cache op)
                ctx = op[5]
                last = self._last[0]
                parent = last[1] if last[0] is ctx else _parent_ids(ctx, self._last)
                rec = (op[0], op[1], op[2], op[3], op[4], parent, op[6], op[7], op[8], op[9],
                       mutations)
                try:
                    parts.append(_MARSHAL(rec, _MARSHAL_VERSION))
                except ValueError:
                    parts.append(rec)  # joined by join_encoded's fallback
                if (len(parts) + self._chunked) % self._encode_batch == 0:
                    self.wake.set()  # a batch is due: the drain thread joins and queues it
            else:
                self._overflow(op, mutations)
            self._recorded_seq = op[7]  # seq_last
        except Exception as e:  # noqa: BLE001 - guard point: never raise into the cache
            self.health.fail("record", e)
            self.health.drop(DROP_OP)
            self.health.drop(DROP_MUTATION, _safe_len(mutations))

    def _full(self, op: tuple, mutations: list[tuple]) -> None:
        """The sink's buffer reached its limit: a batch is due (the drain thread is woken to
        join and queue it, and the sink takes the record), or the capacity is reached (the
        overflow policy). Never raises."""
        try:
            with self._buf_lock:
                self._set_limit()
            sink = self._sink
            if sink.n < sink.limit:
                self.wake.set()
                sink(op, mutations)
            else:
                self._overflow(op, mutations)
        except Exception as e:  # noqa: BLE001 - guard point: never raise into the cache
            self.health.fail("record", e)
            self.health.drop(DROP_OP)
            self.health.drop(DROP_MUTATION, _safe_len(mutations))

    def _fallback(self, op: tuple, mutations: list[tuple]) -> None:
        """A record the sink could not encode (a value marshal cannot take, or not an op
        tuple): the Python path, behind the sink's buffer. Never raises."""
        try:
            self._move_sink()
        except Exception as e:  # noqa: BLE001 - guard point: never raise into the cache
            self.health.fail("record", e)
        TelemetryRecorder.record(self, op, mutations)
        if self._sink is not None:
            with self._buf_lock:
                self._set_limit()  # count the part just appended against the sink's limit

    def _parent_of(self, ctx: Any) -> tuple[int, int, int, bool]:
        """The sink's lookup of a context it has not seen last."""
        return _parent_ids(ctx, self._last)

    def _move_sink(self) -> None:
        """The sink's buffer, as one ``Chunk``, to the end of ``_parts`` (so that a record the
        Python path appends next comes after it)."""
        if self._sink is None:
            return
        with self._buf_lock:
            n, data = self._sink.take()
            if n:
                self._parts.append(Chunk(n, data))
                self._chunked += n - 1
            self._set_limit()

    def _overflow(self, op: tuple, mutations: list[tuple]) -> None:
        if self.overflow == "block" and not self.closed:
            deadline = time.monotonic() + self.block_timeout_s
            while True:
                self._room.clear()  # before the check: a take() after it sets it again
                if self.queued + self.buffered() < self._capacity:
                    self._move_sink()
                    self._parts.append(encode_one(compact_record(op, mutations, self._last)))
                    with self._buf_lock:
                        self._set_limit()
                    return
                self.wake.set()
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    break
                self._room.wait(left)  # a stale or early set() just checks again
        self.health.drop(DROP_OP)
        self.health.drop(DROP_MUTATION, _safe_len(mutations))

    def seal(self) -> None:
        """Join what the buffer holds into one blob and queue it (any thread)."""
        with self._buf_lock:
            # the sink first: what it holds was recorded after every part already in _parts,
            # and before any part the cache thread appends from now on (a part is appended only
            # after _move_sink emptied the sink, which needs this lock)
            if self._sink is not None and self._sink.n and not self._parts:
                # the common case, every record the sink's: its batch whole, with one copy of
                # ~3 MB where joining a part would take two, each holding the GIL
                m, blob = self._sink.take_batch()
                self.pending.append((m, blob))
                self.queued += m
                self._set_limit()
                return
            m, data = self._sink.take() if self._sink is not None and self._sink.n else (0, b"")
            parts = self._parts
            k = len(parts)
            taken = parts[:k]
            del parts[:k]
            n = k + self._chunked + m
            self._chunked = 0
            if m:
                taken.append(Chunk(m, data))
            if n:
                try:
                    blob, lost = join_encoded(taken)
                except Exception as e:  # noqa: BLE001 - a part that cannot be read back
                    # (none is known since decode reads deep records alone): lost, and counted
                    self.health.fail("record.encode", e, f"a batch of {n} records")
                    self.health.drop(DROP_OP, n)
                    self._set_limit()
                    return
                for rec in lost:
                    self.health.fail("record.encode", None, f"op {rec[0]} ({rec[1]}) cannot be "
                                     "encoded")
                    self.health.drop(DROP_OP)
                    self.health.drop(DROP_MUTATION, _safe_len(rec[10]))
                if len(lost) < n:
                    self.pending.append((n - len(lost), blob))
                    self.queued += n - len(lost)
            self._set_limit()

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
            self._set_limit()
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
            parts = list(self._parts)
            if self._sink is not None and self._sink.n:
                parts.append(Chunk(*self._sink.peek()))
        records = [rec for blob in blobs for rec in decode(blob)]
        for part in parts:
            records.extend(part_records(part))
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
        self.overflow = "drop"
        self.pending.clear()
        self.queued = 0
        self._parts.clear()
        self._chunked = 0
        if self._sink is not None:
            self._sink.take()
            self._sink.forget_context()
        self._buf_lock = threading.Lock()  # a lock held by a parent's thread stays held here
        self.queue_capacity = 0
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
