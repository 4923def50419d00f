"""The ``Telemetry`` handle ``telemetry.setup`` returns.

It owns the recorder (``tel.recorder`` goes to ``HiRadixCache(config, recorder=...)``), the drain
pipeline and whatever providers setup created, and is the engine's and UI's way to put events
into the same store: ``record_event``, ``record_violation``, ``record_admission``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixscope.telemetry.names import EVENT_ADMISSION
from radixscope.telemetry.record.drain import Pipeline
from radixscope.telemetry.record.drops import Health, merge_stats
from radixscope.telemetry.record.recorder import TelemetryRecorder
from radixscope.telemetry.store.reader import StoreReader


class Telemetry:
    """A running telemetry setup. Use as a context manager or call ``close()``.

    Attributes:
        recorder: pass to ``HiRadixCache(config, recorder=tel.recorder)``.
        store_path: the store file, or None.
        mode: ``"process"`` or ``"inline"``.
        tracer_provider: the provider host-process spans go through (None if untouched).
        meter_provider: the meter provider (inline mode), else None.
        memory_exporter / metric_reader: set by ``setup(in_memory=True)``.
        sinks: the names of the sinks the stream feeds, in call order.
        prefetch_observer: pass to ``StorageSetup(observer=...)`` (or a
            ``PrefetchController``): L3 prefetch / storage-call spans, and their events into
            the stream for the store and the metrics (``record/prefetch.py``).
    """

    def __init__(self, recorder: TelemetryRecorder, pipeline: Pipeline, health: Health,
                 store_path: Path | None, mode: str) -> None:
        self.recorder = recorder
        self.pipeline = pipeline
        self.health = health
        self.store_path = store_path
        self.mode = mode
        self.tracer_provider: Any = None
        self.meter_provider: Any = None
        self.memory_exporter: Any = None
        self.metric_reader: Any = None
        self.sinks: tuple[str, ...] = ()
        self.prefetch_observer: Any = None
        self.closed = False
        self._owned: list[Any] = []  # providers setup created: shut down on close
        self._borrowed: list[Any] = []  # providers the caller owns: only flushed

    def adopt(self, owned: Sequence[Any] = (), borrowed: Sequence[Any] = ()) -> None:
        """Providers to flush on ``flush``/``close``; ``owned`` ones are also shut down."""
        self._owned.extend(owned)
        self._borrowed.extend(borrowed)

    # ---- events into the store -------------------------------------------------------------
    def record_event(self, kind: str, attrs: dict | None = None, *, seq: int | None = None,
                     ts_ns: int | None = None) -> None:
        """Put an event into the store's ``events`` table (any thread; never raises).

        Args:
            kind: a short, low-cardinality kind (``"admission"``, ``"bundle"``, ...).
            attrs: JSON-able details.
            seq: the journal seq it refers to; default the latest seq recorded.
            ts_ns: wall-clock time; default now.
        """
        with self.health.guard("record_event"):
            s = self.recorder.current_seq() if seq is None else seq
            self.recorder.submit(("event", ts_ns or time.time_ns(), s, str(kind),
                                  dict(attrs or {})))

    def record_violation(self, message: str, *, kind: str = "invariant",
                         seq: int | None = None, details: dict | None = None,
                         ts_ns: int | None = None) -> None:
        """Put an invariant violation (or other integrity failure) into ``violations``.

        Args:
            message: the human-readable text (e.g. ``str(InvariantViolation)``).
            kind: ``"invariant"``, ``"budget"``, ``"oom"``...
            seq: the journal seq at which it was seen; default the latest recorded.
            details: JSON-able structured details (node ids, numbers).
            ts_ns: wall-clock time; default now.
        """
        with self.health.guard("record_violation"):
            s = self.recorder.current_seq() if seq is None else seq
            self.recorder.submit(("violation", ts_ns or time.time_ns(), s, str(kind),
                                  str(message), dict(details or {})))

    def record_admission(self, req_id: str | None, admitted: bool, **attrs: Any) -> None:
        """Record an admission decision: an ``admission`` event plus the admissions counter.

        Args:
            req_id: the request.
            admitted: the decision.
            attrs: the budget numbers behind it (per component needs / available...).
        """
        self.record_event(EVENT_ADMISSION, {"req_id": req_id, "admitted": bool(admitted),
                                            **attrs})

    # ---- lifecycle -------------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> dict:
        """Ship everything recorded so far and wait until the store has committed it.

        Returns:
            Merged stats (see ``stats``).
        """
        if self.closed:
            return self.stats()
        self._flush_providers()
        self.pipeline.flush(timeout_s)
        return self.stats()

    def _flush_providers(self) -> None:
        for p in self._owned + self._borrowed:
            if hasattr(p, "force_flush"):
                with self.health.guard("provider.force_flush"):
                    p.force_flush()

    def close(self, timeout_s: float = 30.0) -> dict:
        """Flush everything, stop the drain thread and the writer, shut down owned providers.
        Idempotent.

        Returns:
            Final merged stats.
        """
        if self.closed:
            return self.stats()
        self._flush_providers()
        self.closed = True
        self.pipeline.close(timeout_s)
        for p in self._owned:
            with self.health.guard("provider.shutdown"):
                p.shutdown()
        return self.stats()

    def stats(self) -> dict:
        """Telemetry health: ``{"dropped": {op, mutation, span, event}, "failures": {stage: n},
        "notes": {...}}``: this process's counters plus the sinks' own as of the last flush."""
        return merge_stats(self.health.snapshot(), self.pipeline.last_stats or {})

    def open_store(self) -> StoreReader:
        """A read-only reader of this setup's store (``telemetry.open_store``).

        Raises:
            ValueError: this setup has no store.
        """
        if self.store_path is None:
            raise ValueError("this telemetry setup has no store (setup(store=None))")
        return StoreReader(self.store_path)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

