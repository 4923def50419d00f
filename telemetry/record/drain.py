"""The drain thread: moves recorded batches from the recorder to a transport, off the hot path.

Every ``interval_s`` (or at once when the recorder's ``wake`` event is set: a batch of records
due, overflow, close), it takes the pending op records (already encoded by the recorder) and
side messages (host spans become rows here), hands them to the transport (the writer process,
or the sink inline) and keeps the batch in the flight-recorder ring. ``flush`` and ``close`` run
the same cycle on the caller's thread under the same lock, so exactly one thread sends at a
time. Nothing here raises into the cache: a failing cycle is logged and counted, and the
records it carried are counted as dropped.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from radixscope.telemetry.record.drops import DROP_EVENT, DROP_MUTATION, DROP_OP, DROP_SPAN, Health
from radixscope.telemetry.record.encode import decode_records, span_row
from radixscope.telemetry.record.recorder import TelemetryRecorder


class Transport(Protocol):
    """Where drained messages go (``telemetry/sinks/transport.py``). Optional: ``prioritize()
    -> bool`` and ``deprioritize()``, around the waits of ``flush`` and ``close``."""

    def send(self, messages: list[tuple]) -> None: ...

    def flush(self, timeout_s: float) -> dict: ...

    def close(self, timeout_s: float) -> dict: ...


class Pipeline:
    """Owns the drain thread.

    Args:
        recorder: the recorder the cache appends to.
        transport: where messages go.
        health: host-side counters (shipped to the sinks as ``host_stats``).
        interval_s: drain period. Long on purpose: every wake-up takes the GIL from the
            cache's thread, and a thread waking every 5 ms measured +5-7 % CPU time on a
            tight loop of cache ops (every 100 ms: noise). Records wait as ``bytes``, which
            the garbage collector never scans, so a long period costs only latency.
        batch_max: most op records per message batch.
    """

    def __init__(self, recorder: TelemetryRecorder, transport: Transport, health: Health,
                 interval_s: float = 0.1, batch_max: int = 4096) -> None:
        if not interval_s > 0 or batch_max < 1:
            raise ValueError(f"bad drain settings: interval_s={interval_s!r} "
                             f"batch_max={batch_max!r}")
        self.recorder = recorder
        self.transport = transport
        self.health = health
        self.interval_s = interval_s
        self.batch_max = batch_max
        self.cycles = 0
        self.shipped = 0  # op records handed to the transport
        self.last_stats: dict = {}
        self._lock = threading.Lock()
        self._stop = False
        self._closed = False
        self._sent_stats: dict = {}
        self._thread = threading.Thread(target=self._run, name="radixscope-telemetry-drain",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wake = self.recorder.wake
        while not self._stop:
            wake.wait(self.interval_s)
            wake.clear()
            if self._stop:
                break
            with self._lock, self.health.guard("drain.cycle"):
                if not self._closed:
                    self._drain()

    def _drain(self) -> int:
        """Ship everything pending. Caller holds ``self._lock``. Returns op records shipped."""
        shipped = 0
        rec = self.recorder
        rec.seal()  # records still in the recorder's encode buffer ship now too
        while True:
            side = rec.take_side(self.batch_max)
            batch = rec.take(self.batch_max)
            if not side and not batch:
                break
            self._ship(side, batch)
            shipped += sum(n for n, _ in batch)
        self.shipped += shipped
        stats = self.health.snapshot()
        if stats != self._sent_stats:
            self._sent_stats = stats
            with self.health.guard("drain.stats"):
                self.transport.send([("host_stats", stats)])
        self.cycles += 1
        return shipped

    def _ship(self, side: list[tuple], batch: list[tuple[int, bytes]]) -> None:
        """Send side messages and ``(records, blob)`` entries as one message batch."""
        blobs = [blob for _, blob in batch]
        msgs: list[tuple] = []
        spans: list = []
        bad = 0
        try:
            for m in side:
                if m[0] == "span":
                    try:
                        spans.append(span_row(m[1]))
                    except Exception as e:  # noqa: BLE001 - guard point: one bad span
                        self.health.fail("drain.span_row", e)
                        self.health.drop(DROP_SPAN)
                        bad += 1
                elif m[0] == "attach":
                    msgs.append(("attach", m[1], m[2].to_dict()))
                else:
                    msgs.append(m)
            if spans:
                msgs.append(("spans", spans))
            if blobs:
                msgs.append(("ops", blobs))
            self.transport.send(msgs)
        except Exception as e:  # noqa: BLE001 - guard point: count what is lost
            n_ops = sum(n for n, _ in batch)
            self.health.fail("drain", e, f"{n_ops} ops, {len(side)} side messages")
            self.health.drop(DROP_OP, n_ops)
            self.health.drop(DROP_MUTATION, _mutations_in(blobs))
            self.health.drop(DROP_SPAN, sum(1 for m in side if m[0] == "span") - bad)
            self.health.drop(DROP_EVENT, sum(1 for m in side if m[0] in ("event", "violation")))
        with self.health.guard("drain.remember"):
            self.recorder.remember(batch)

    def flush(self, timeout_s: float = 30.0) -> dict:
        """Ship everything recorded so far and wait until the sinks have committed it.

        Args:
            timeout_s: longest wait for the sinks' acknowledgement.

        Returns:
            Merged telemetry stats (dropped / failures / notes) as the sinks see them.
        """
        # before the lock: the drain thread may hold it, blocked on a full pipe to the writer
        raised = not self._closed and self._prioritize()
        try:
            with self._lock:
                if self._closed:
                    return self.last_stats
                self._drain()
                with self.health.guard("flush"):
                    self.last_stats = self.transport.flush(timeout_s)
                return self.last_stats
        finally:
            if raised:
                with self.health.guard("flush.deprioritize"):
                    self.transport.deprioritize()  # type: ignore[attr-defined]

    def _prioritize(self) -> bool:
        """This thread is about to wait for the sinks: a transport that runs them niced in
        another process (``ProcessTransport.prioritize``) runs them at this process's
        priority meanwhile, so a busy machine cannot starve a backlog's drain."""
        fn = getattr(self.transport, "prioritize", None)
        if fn is None:
            return False
        with self.health.guard("prioritize"):
            return bool(fn())
        return False

    def close(self, timeout_s: float = 30.0) -> dict:
        """Stop the drain thread, ship the rest, close the transport. Idempotent."""
        if not self._closed:
            # for good (the writer exits after this), and first: the drain thread joined
            # below may be blocked on a full pipe to the writer, draining at its pace
            self._prioritize()
        self._stop = True
        self.recorder.closed = True
        self.recorder.queue_capacity = 0  # later records are dropped and counted
        self.recorder.wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout_s)
        with self._lock:
            if self._closed:
                return self.last_stats
            deadline = time.monotonic() + timeout_s
            self._drain()
            self._closed = True
            with self.health.guard("close"):
                self.last_stats = self.transport.close(max(0.1, deadline - time.monotonic()))
            return self.last_stats


def _mutations_in(batch: list[bytes]) -> int:
    """Mutations inside encoded records (to count what a failed shipment lost)."""
    try:
        return len(decode_records(batch)[1])
    except Exception:  # noqa: BLE001 - a corrupt blob: the ops are counted, not these
        return 0
