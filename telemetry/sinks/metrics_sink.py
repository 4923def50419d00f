"""The metric sink: the OTel instruments of ``telemetry/sinks/metrics.py``, fed by the stream.

Built from the registry as ``metrics`` (``telemetry/sinks/base.py``), in one of two ways:

- ``MetricsSink(health, meter_provider=mp)`` (inline mode): instruments on that provider
  (the handle owns it); ``flush`` force-flushes it.
- ``MetricsSink(health, backends=spec)`` (the writer process): a provider with the metric
  readers ``spec`` asks for (OTLP, Prometheus), owned here; with none, no instruments at all
  (the store's pool samples come from the replica either way).

The pool gauges read the fan-out's journal replica (given at ``attach``); the telemetry
drop / failure counters read the fan-out's merged stats (given at ``bind``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics as metrics_api
from opentelemetry.sdk.metrics import MeterProvider

from radixscope.telemetry.names import (
    EVENT_ADMISSION,
    EVENT_PREFETCH_END,
    EVENT_PREFETCH_START,
    EVENT_STORAGE_PREFIX,
)
from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.record.encode import CompactOp
from radixscope.telemetry.sinks import otel_exporters as otel
from radixscope.telemetry.sinks.metrics import CacheMetrics

if TYPE_CHECKING:
    from radixscope.cache.snapshot import CacheSnapshot
    from radixscope.telemetry.store.journal import Journal


class MetricsSink:
    """OTel metrics of the cache (see the module docstring).

    Args:
        health: the fan-out's counters.
        meter_provider: inline mode: the instruments' provider.
        backends: writer process: the metric readers to build (a ``BackendSpec``).
    """

    def __init__(self, health: Health, meter_provider: metrics_api.MeterProvider | None = None,
                 backends: otel.BackendSpec | None = None) -> None:
        self.health = health
        self._owned: MeterProvider | None = None
        self._stats: Any = health.snapshot
        mp = meter_provider
        if mp is None:
            spec = backends if backends is not None else otel.BackendSpec()
            readers = otel.metric_readers(spec, health)
            if readers:
                mp = self._owned = MeterProvider(metric_readers=readers,
                                                 resource=otel.resource(spec))
        self.provider = mp
        self.metrics = CacheMetrics(mp, self.stats) if mp is not None else None

    def bind(self, fanout: Any) -> None:
        """Read the fan-out's merged stats (host side + this side) for the telemetry counters."""
        self._stats = fanout.stats

    def stats(self) -> dict:
        return self._stats()

    def attach(self, info: dict, snapshot: CacheSnapshot, replica: Journal | None) -> None:
        if self.metrics is not None:
            self.metrics.journal = replica

    def ops(self, ops: Sequence[CompactOp], mutations: Sequence[tuple]) -> None:
        if self.metrics is not None:
            with self.health.guard("metrics"):
                self.metrics.observe_ops(ops)
                self.metrics.observe_mutations(mutations)

    def event(self, ts_ns: int, seq: int | None, kind: str, attrs: dict) -> None:
        if self.metrics is None:
            return
        if kind == EVENT_ADMISSION:
            self.metrics.observe_admission(bool(attrs.get("admitted")))
        elif kind in (EVENT_PREFETCH_START, EVENT_PREFETCH_END) or kind.startswith(
                EVENT_STORAGE_PREFIX):
            with self.health.guard("metrics"):
                self.metrics.storage.observe(kind, attrs)

    def flush(self) -> None:
        if self.provider is not None and hasattr(self.provider, "force_flush"):
            self.provider.force_flush()

    def close(self) -> None:
        if self._owned is not None:
            self._owned.shutdown()
