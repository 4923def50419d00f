"""Test kit for telemetry: inline telemetry on a test-local tracer provider, and small helpers.

Every test builds its own ``TracerProvider`` (the global one can be set only once per process)
and runs telemetry inline, so spans are delivered synchronously on ``tel.flush()``.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from tests.kits.cachekit import make_config


class Rig:
    """A cache wired to inline telemetry with in-memory span and metric readers."""

    def __init__(self, tmp: Path | None, components=("full",), store: bool = True,
                 metrics: bool = False, keyframe_every: int = 20000,
                 sample_every_ms: float = 100.0, **cfg) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader() if metrics else None
        mp = MeterProvider(metric_readers=[self.reader]) if metrics else None
        self.store_path = (tmp / "store.db") if (store and tmp is not None) else None
        self.tel = telemetry.setup(store=self.store_path, mode="inline",
                                   tracer_provider=self.provider, meter_provider=mp,
                                   metrics=metrics, capture_host_spans=False,
                                   keyframe_every=keyframe_every,
                                   sample_every_ms=sample_every_ms)
        self.cache = HiRadixCache(make_config(components, **cfg), recorder=self.tel.recorder)
        self.tracer = self.provider.get_tracer("tests.engine")

    def spans(self, clear: bool = True) -> list:
        self.tel.flush()
        out = list(self.exporter.get_finished_spans())
        if clear:
            self.exporter.clear()
        return out

    def cache_spans(self) -> list:
        return [s for s in self.spans() if s.name.startswith("kv_cache.")]

    def close(self) -> dict:
        return self.tel.close()


def metric_points(reader: InMemoryMetricReader) -> dict[str, list]:
    """Metric name -> data points of the last collection."""
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def by_labels(points: list, *keys: str) -> dict[tuple, object]:
    """Data points keyed by the values of ``keys`` in their attributes."""
    return {tuple(p.attributes.get(k) for k in keys): p for p in points}
