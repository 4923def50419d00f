"""Where spans and metrics go besides the store: OTLP (http/protobuf or grpc), console,
Prometheus. A plain, picklable ``BackendSpec`` says which; the providers are built from it
wherever the sinks run (the writer process or, inline, the host). Optional exporter packages
are imported lazily; ``check_available`` fails early, in ``setup``, with the package to install.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.sinks.otel_processors import (
    BoundedBatchSpanProcessor,
    GuardedMetricExporter,
    GuardedSpanExporter,
)

PROTOCOLS = ("grpc", "http/protobuf")
_OTLP_HINT = "install the OTLP exporters: pip install 'radixscope[otlp]'"


@dataclass(frozen=True)
class BackendSpec:
    """Exporters besides the store.

    Attributes:
        service_name: ``service.name`` of the resource (``OTEL_SERVICE_NAME`` /
            ``OTEL_RESOURCE_ATTRIBUTES`` still apply on top, as the SDK reads them).
        otlp_traces / otlp_metrics: OTLP protocol (``grpc`` or ``http/protobuf``) or None.
        console: print spans to stdout.
        prometheus: ``(host, port)`` for a Prometheus scrape endpoint, or None.
        metric_interval_ms: OTLP metric export period.
        span_queue / span_delay_s / span_batch: batch export tuning for network exporters.
    """

    service_name: str = "radixscope"
    otlp_traces: str | None = None
    otlp_metrics: str | None = None
    console: bool = False
    prometheus: tuple[str, int] | None = None
    metric_interval_ms: int = 10000
    span_queue: int = 16384
    span_delay_s: float = 0.2
    span_batch: int = 512

    def __post_init__(self) -> None:
        for name in ("otlp_traces", "otlp_metrics"):
            v = getattr(self, name)
            if v is not None and v not in PROTOCOLS:
                raise ValueError(f"{name}={v!r}: must be one of {PROTOCOLS} or None")


def otlp_from_env(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """OTLP protocols for traces and metrics selected by the standard ``OTEL_*`` variables.

    OTLP is on for a signal when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or the signal's own
    ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`` is set; the protocol comes from
    ``OTEL_EXPORTER_OTLP_{SIGNAL}_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``, then
    ``http/protobuf`` (the specification's default).

    Args:
        environ: the environment (``os.environ`` when None).

    Returns:
        ``(traces protocol or None, metrics protocol or None)``.

    Raises:
        ValueError: a protocol variable names an unsupported protocol.
    """
    env = os.environ if environ is None else environ
    out: list[str | None] = []
    for signal in ("TRACES", "METRICS"):
        on = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        if not on:
            out.append(None)
            continue
        proto = (env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
                 or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
        if proto not in PROTOCOLS:
            raise ValueError(f"OTEL_EXPORTER_OTLP protocol {proto!r}: must be one of {PROTOCOLS}")
        out.append(proto)
    return out[0], out[1]


def check_available(spec: BackendSpec) -> None:
    """Import every optional package ``spec`` needs, so a missing one fails in ``setup``.

    Raises:
        ImportError: naming the package to install.
    """
    if spec.otlp_traces or spec.otlp_metrics:
        for proto in {spec.otlp_traces, spec.otlp_metrics} - {None}:
            _otlp_module(proto, "trace_exporter")
    if spec.prometheus is not None:
        _prometheus()


def _otlp_module(protocol: str, what: str):
    import importlib

    pkg = "grpc" if protocol == "grpc" else "http"
    name = f"opentelemetry.exporter.otlp.proto.{pkg}.{what}"
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"OTLP {protocol} needs {name} ({e}); {_OTLP_HINT}") from None


def _prometheus():
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError as e:
        raise ImportError(f"a Prometheus endpoint needs opentelemetry-exporter-prometheus and "
                          f"prometheus-client ({e}); pip install opentelemetry-exporter-prometheus"
                          ) from None
    return PrometheusMetricReader, start_http_server


def resource(spec: BackendSpec) -> Resource:
    """The resource of every provider telemetry builds (env attributes merged by the SDK)."""
    return Resource.create({"service.name": spec.service_name})


def span_exporters(spec: BackendSpec) -> list[SpanExporter]:
    """The network / console span exporters ``spec`` asks for (not wrapped)."""
    out: list[SpanExporter] = []
    if spec.otlp_traces:
        out.append(_otlp_module(spec.otlp_traces, "trace_exporter").OTLPSpanExporter())
    if spec.console:
        out.append(ConsoleSpanExporter())
    return out


def batch_processors(exporters: list[SpanExporter], spec: BackendSpec,
                     health: Health) -> list[BoundedBatchSpanProcessor]:
    """One guarded, bounded batch processor per exporter."""
    return [BoundedBatchSpanProcessor(GuardedSpanExporter(exp, health), health,
                                      max_queue_size=spec.span_queue,
                                      schedule_delay_s=spec.span_delay_s,
                                      max_export_batch_size=spec.span_batch)
            for exp in exporters]


def add_exporters(provider: TracerProvider, exporters: list[SpanExporter], spec: BackendSpec,
                  health: Health) -> list[BoundedBatchSpanProcessor]:
    """Attach each exporter to ``provider`` behind a guarded, bounded batch processor."""
    procs = batch_processors(exporters, spec, health)
    for p in procs:
        provider.add_span_processor(p)
    return procs


def metric_readers(spec: BackendSpec, health: Health) -> list[MetricReader]:
    """OTLP periodic reader (its failed exports counted in ``health``) and/or Prometheus reader
    (starting its HTTP server)."""
    readers: list[MetricReader] = []
    if spec.otlp_metrics:
        exporter = _otlp_module(spec.otlp_metrics, "metric_exporter").OTLPMetricExporter()
        readers.append(PeriodicExportingMetricReader(
            GuardedMetricExporter(exporter, health),
            export_interval_millis=spec.metric_interval_ms))
    if spec.prometheus is not None:
        reader_cls, start_http_server = _prometheus()
        host, port = spec.prometheus
        start_http_server(port=port, addr=host)
        readers.append(reader_cls())
    return readers


def build_tracer_provider(spec: BackendSpec) -> TracerProvider:
    """A tracer provider with ``spec``'s resource and no processors yet."""
    return TracerProvider(resource=resource(spec))
