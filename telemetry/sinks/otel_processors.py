"""Span processors and exporter wrappers tuned for a cache.

- ``StoreSpanProcessor`` hands every finished span to a callback (the store's side channel), so
  any span of the process (an engine's request spans included) lands in the store.
- ``BoundedBatchSpanProcessor`` batches spans for a network or console exporter with a short
  delay and a bounded queue, and *counts* what it drops (the SDK's batch processor only logs).
- ``GuardedSpanExporter`` turns an exporter's exception or failure into a logged, counted
  failure; spans in a failed batch are counted as dropped. ``GuardedMetricExporter`` does the
  same for a metric exporter (OTLP metrics).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from radixscope.telemetry.record.drops import DROP_SPAN, Health


class StoreSpanProcessor(SpanProcessor):
    """Passes each ended span to ``put`` (which must be cheap and must not raise).

    Args:
        put: receives the ``ReadableSpan``.
        health: counts a failing ``put``.
    """

    def __init__(self, put: Callable[[ReadableSpan], None], health: Health) -> None:
        self._put = put
        self._health = health

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        with self._health.guard("store_span_processor"):
            self._put(span)

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class GuardedSpanExporter(SpanExporter):
    """Wraps an exporter so that nothing it does escapes; failures are counted.

    Args:
        inner: the real exporter.
        health: shared counters; failures go under ``exporter.<class name>``.
    """

    def __init__(self, inner: SpanExporter, health: Health) -> None:
        self.inner = inner
        self._health = health
        self.stage = f"exporter.{type(inner).__name__}"

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as e:  # noqa: BLE001 - guard point: log + count
            self._health.fail(self.stage, e, f"exporting {len(spans)} spans")
            self._health.drop(DROP_SPAN, len(spans))
            return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._health.fail(self.stage, None, f"exporter returned {result!r}")
            self._health.drop(DROP_SPAN, len(spans))
        return result

    def shutdown(self) -> None:
        with self._health.guard(self.stage, "shutdown"):
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._health.guard(self.stage, "force_flush"):
            return bool(self.inner.force_flush(timeout_millis))
        return False


class GuardedMetricExporter(MetricExporter):
    """Wraps a metric exporter (OTLP) the same way: a failed export (an exception, or a result
    other than SUCCESS: an unreachable collector) is counted under ``exporter.<class name>``
    and never escapes into the periodic reader's thread.

    Args:
        inner: the real exporter; its preferred temporality and aggregation are kept.
        health: shared counters.
    """

    def __init__(self, inner: MetricExporter, health: Health) -> None:
        super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                         preferred_aggregation=getattr(inner, "_preferred_aggregation", None))
        self.inner = inner
        self._health = health
        self.stage = f"exporter.{type(inner).__name__}"

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as e:  # noqa: BLE001 - guard point: log + count
            self._health.fail(self.stage, e, "exporting metrics")
            return MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._health.fail(self.stage, None, f"exporter returned {result!r}")
        return result

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        with self._health.guard(self.stage, "shutdown"):
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        with self._health.guard(self.stage, "force_flush"):
            return bool(self.inner.force_flush(timeout_millis=timeout_millis))
        return False


class BoundedBatchSpanProcessor(SpanProcessor):
    """A batch processor with a bounded queue that counts the spans it drops.

    Args:
        exporter: where batches go (wrap it in ``GuardedSpanExporter``).
        health: drop counters.
        max_queue_size: spans queued before new ones are dropped (and counted).
        schedule_delay_s: longest a span waits before its batch is exported.
        max_export_batch_size: spans per ``export`` call.
    """

    def __init__(self, exporter: SpanExporter, health: Health, max_queue_size: int = 16384,
                 schedule_delay_s: float = 0.2, max_export_batch_size: int = 512) -> None:
        if max_queue_size < 1 or max_export_batch_size < 1 or schedule_delay_s <= 0:
            raise ValueError(f"bad batch settings: queue={max_queue_size!r} "
                             f"batch={max_export_batch_size!r} delay={schedule_delay_s!r}")
        self.exporter = exporter
        self._health = health
        self._max_queue = max_queue_size
        self._delay = schedule_delay_s
        self._batch = max_export_batch_size
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="radixscope-span-batch",
                                        daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopped or len(self._queue) >= self._max_queue:
            self._health.drop(DROP_SPAN)
            return
        self._queue.append(span)
        if len(self._queue) >= self._batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._export_all()

    def _export_all(self) -> None:
        with self._export_lock:
            q = self._queue
            while q:
                batch = [q.popleft() for _ in range(min(self._batch, len(q)))]
                with self._health.guard("batch_span_processor"):
                    self.exporter.export(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._export_all()
        return True

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._export_all()
        with self._health.guard("batch_span_processor", "shutdown"):
            self.exporter.shutdown()
