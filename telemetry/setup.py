"""``telemetry.setup``: one call that wires the recorder, the drain pipeline and the sinks.

Defaults: an embedded store under ``runs/``, sinks in a separate writer process, OTLP when the
standard ``OTEL_EXPORTER_OTLP_*`` variables are set, and host-process spans (an engine's
request spans) captured into the store through the global tracer provider.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from radixscope.telemetry.handle import Telemetry
from radixscope.telemetry.kvevents.config import KvEventsConfig
from radixscope.telemetry.kvevents.config import resolve as resolve_kv_events
from radixscope.telemetry.names import DEFAULT_SERVICE_NAME
from radixscope.telemetry.options import TelemetryOptions
from radixscope.telemetry.record.drain import Pipeline
from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.record.prefetch import TelemetryPrefetchObserver
from radixscope.telemetry.record.recorder import TelemetryRecorder
from radixscope.telemetry.sinks import base as sinkbase
from radixscope.telemetry.sinks import otel_exporters as backends
from radixscope.telemetry.sinks.fanout import Fanout
from radixscope.telemetry.sinks.otel_processors import StoreSpanProcessor
from radixscope.telemetry.sinks.transport import InlineTransport, ProcessTransport
from radixscope.telemetry.sinks.writer_process import WriterSpec
from radixscope.telemetry.store.schema import create_store, resolve_new_store

MODES = ("process", "inline")
AUTO = "auto"


def setup(store: str | os.PathLike | None = AUTO, *, overwrite: bool = False,
          mode: str = "process", spans: bool = True, metrics: bool = True,
          otlp: str | bool | None = None, console: bool = False,
          prometheus: int | tuple[str, int] | None = None,
          service_name: str = DEFAULT_SERVICE_NAME,
          tracer_provider: trace.TracerProvider | None = None,
          meter_provider: metrics_api.MeterProvider | None = None,
          span_exporters: Sequence[SpanExporter] = (), in_memory: bool = False,
          capture_host_spans: bool = True, options: TelemetryOptions | None = None,
          sinks: Mapping[str, Mapping[str, Any]] | None = None,
          kv_events: Any = None, **knobs: Any) -> Telemetry:
    """Start telemetry and return its handle.

    Args:
        store: store file path; ``"auto"`` = ``runs/telemetry-<time>-<pid>.db``; None = none.
        overwrite: replace an existing store file instead of raising ``FileExistsError``.
        mode: ``"process"`` (sinks in a writer process: the fast default) or ``"inline"``
            (sinks on this process's drain thread: tests, in-memory exporters).
        spans: build a span per cache op (the built-in ``spans`` sink).
        metrics: keep the OTel metric instruments (the built-in ``metrics`` sink).
        otlp: None = from ``OTEL_EXPORTER_OTLP_*``; ``"grpc"`` / ``"http/protobuf"`` = on with
            that protocol; True = on (protocol from env, default http/protobuf); False = off.
        console: also print spans to stdout.
        prometheus: port (or ``(host, port)``) of a Prometheus scrape endpoint; needs
            ``opentelemetry-exporter-prometheus``.
        service_name: ``service.name`` of the resource.
        tracer_provider: inline mode only: build cache spans on this provider (its processors
            receive them; the store's processor is added to it).
        meter_provider: inline mode only: the instruments' provider.
        span_exporters: inline mode only: extra exporters (batched, guarded).
        in_memory: inline mode with an ``InMemorySpanExporter`` (``tel.memory_exporter``) and an
            ``InMemoryMetricReader`` (``tel.metric_reader``); store defaults to none.
        capture_host_spans: route this process's own spans (global provider) into the store.
        options: the tuning knobs (``TelemetryOptions``: keyframe and sample cadence, queue
            and overflow, drain interval, context capture, writer niceness, flight ring).
        sinks: further outputs by registered name -> options (``telemetry/sinks/base.py``);
            a new output is registered there, not added here as a parameter.
        kv_events: shorthand for ``sinks={"kv_events": ...}`` (vLLM-format KV events): an
            endpoint the PUB socket binds, a dict or ``KvEventsConfig``; None = from
            ``RADIXSCOPE_KV_EVENTS``; False = off.
        **knobs: any ``TelemetryOptions`` field by name (``keyframe_every=40``), on top of
            ``options``.

    Returns:
        The ``Telemetry`` handle; ``tel.recorder`` goes to the cache, ``tel.prefetch_observer``
        to ``StorageSetup(observer=...)``; ``tel.close()`` flushes;
        ``tel.sinks`` names the sinks in call order.

    Raises:
        TypeError: a keyword that is neither a parameter nor a ``TelemetryOptions`` field.
        ValueError: bad argument values or store path (naming them).
        FileExistsError: the store exists and ``overwrite`` is False.
        ImportError: an optional exporter package is missing (naming it).
    """
    opts = TelemetryOptions.merged(options, knobs)
    if in_memory:
        mode = "inline"
        store = None if store == AUTO else store
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: must be one of {MODES}")
    if mode == "process" and (tracer_provider is not None or meter_provider is not None
                              or span_exporters):
        raise ValueError("tracer_provider / meter_provider / span_exporters need mode='inline' "
                         "(in process mode the writer process builds its own providers)")
    kv_cfg = resolve_kv_events(kv_events)
    if kv_cfg is not None:  # the documented shorthand for sinks={"kv_events": {...}}
        sinks = {**(sinks or {}), "kv_events": dataclasses.asdict(kv_cfg)}
    extra = sinkbase.check(sinks)
    kv_sink = dict(extra).get("kv_events")
    if kv_sink is not None:  # an endpoint in use is refused before the store is replaced
        from radixscope.telemetry.kvevents.publisher import check_endpoints
        check_endpoints(KvEventsConfig(**kv_sink))
    spec = _backend_spec(otlp, console, prometheus, service_name)
    backends.check_available(spec)
    path = _store_path(store, overwrite)
    settings = {"mode": mode, "keyframe_every": opts.keyframe_every,
                "keyframe_nodes": opts.keyframe_nodes,
                "sample_every_ms": opts.sample_every_ms, "spans": spans, "metrics": metrics,
                "overflow": opts.overflow, "queue_capacity": opts.queue_capacity}
    health = Health()
    recorder = TelemetryRecorder(health, queue_capacity=opts.queue_capacity,
                                 overflow=opts.overflow, block_timeout_s=opts.block_timeout_s,
                                 ring_capacity=opts.flight_ring,
                                 capture_context=opts.capture_context)
    settings["encoder"] = recorder.encoder  # "python": built without a C compiler (Health says)
    if path is not None:
        create_store(path, settings, overwrite=overwrite)
    if mode == "process":
        resource = dict(backends.resource(spec).attributes)
        specs = _sink_specs(spans and {"backends": spec}, metrics and {"backends": spec},
                            extra, path, opts, resource)
        wspec = WriterSpec(specs, opts.writer_nice, sinkbase.targets(specs))
        transport: Any = ProcessTransport(wspec, health)
        tel = Telemetry(recorder, Pipeline(recorder, transport, health, opts.drain_interval_s),
                        health, path, mode)
        tel.sinks = tuple(name for name, _ in wspec.sinks)
        if capture_host_spans:
            _capture_host_spans(tel, spec, recorder, health)
    else:
        tel = _inline(recorder, health, path, spec, spans, metrics, tracer_provider,
                      meter_provider, span_exporters, in_memory, capture_host_spans, opts, extra)
    tel.prefetch_observer = TelemetryPrefetchObserver(
        recorder, health, tracer_provider=tel.tracer_provider, spans=spans)
    _close_at_exit(tel)
    return tel


def _sink_specs(spans: dict | bool, metrics: dict | bool, extra: tuple[tuple[str, dict], ...],
                path: Path | None, opts: TelemetryOptions, resource: dict | None
                ) -> tuple[tuple[str, dict], ...]:
    """The sinks in call order: spans (the store reads their ids), metrics, the registered
    ones, the store last (it commits what the batch left)."""
    out: list[tuple[str, dict]] = []
    if spans:
        out.append(("spans", dict(spans)))
    if metrics:
        out.append(("metrics", dict(metrics)))
    out.extend(extra)
    if path is not None:
        out.append(("store", {"path": str(path), "keyframe_every": opts.keyframe_every,
                              "keyframe_nodes": opts.keyframe_nodes,
                              "sample_every_ms": opts.sample_every_ms, "resource": resource}))
    return tuple(out)


def _backend_spec(otlp: str | bool | None, console: bool,
                  prometheus: int | tuple[str, int] | None,
                  service_name: str) -> backends.BackendSpec:
    env_traces, env_metrics = backends.otlp_from_env()
    if otlp is None:
        traces, mets = env_traces, env_metrics
    elif otlp is False:
        traces = mets = None
    elif otlp is True:
        traces = env_traces or "http/protobuf"
        mets = env_metrics or traces
    else:
        traces = mets = str(otlp)
    prom = None
    if prometheus is not None:
        prom = ("localhost", int(prometheus)) if isinstance(prometheus, int) else (
            str(prometheus[0]), int(prometheus[1]))
    return backends.BackendSpec(service_name=service_name, otlp_traces=traces,
                                otlp_metrics=mets, console=console, prometheus=prom)


def _store_path(store: str | os.PathLike | None, overwrite: bool) -> Path | None:
    if store is None:
        return None
    if store == AUTO:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        store = Path("runs") / f"telemetry-{stamp}-{os.getpid()}.db"
    return resolve_new_store(store, overwrite)


def _capture_host_spans(tel: Telemetry, spec: backends.BackendSpec,
                        recorder: TelemetryRecorder, health: Health) -> None:
    """Process mode: this process's spans reach the store through the recorder's side queue."""
    if tel.store_path is None:
        return

    def put(span: Any) -> None:
        if not tel.closed:
            recorder.submit(("span", span))

    proc = StoreSpanProcessor(put, health)
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        current.add_span_processor(proc)
        tel.tracer_provider = current
        tel.adopt(borrowed=[current])
        return
    tp = backends.build_tracer_provider(spec)
    tp.add_span_processor(proc)
    backends.add_exporters(tp, backends.span_exporters(spec), spec, health)
    trace.set_tracer_provider(tp)
    tel.tracer_provider = tp
    tel.adopt(owned=[tp])


def _inline(recorder: TelemetryRecorder, health: Health, path: Path | None,
            spec: backends.BackendSpec, spans: bool, metrics: bool,
            tracer_provider: trace.TracerProvider | None,
            meter_provider: metrics_api.MeterProvider | None,
            span_exporters: Sequence[SpanExporter], in_memory: bool, capture_host_spans: bool,
            opts: TelemetryOptions, extra: tuple[tuple[str, dict], ...] = ()) -> Telemetry:
    """Inline mode: the sinks run on the drain thread; cache spans go through a provider."""
    tp = mem_exp = None
    if spans:
        tp = tracer_provider or backends.build_tracer_provider(spec)
        if isinstance(tp, TracerProvider):
            if in_memory:
                mem_exp = InMemorySpanExporter()
                tp.add_span_processor(SimpleSpanProcessor(mem_exp))
            backends.add_exporters(tp, [*backends.span_exporters(spec), *span_exporters],
                                   spec, health)
    mp = reader = None
    if metrics:
        mp = meter_provider
        if mp is None:
            readers = backends.metric_readers(spec, health)
            if in_memory:
                reader = InMemoryMetricReader()
                readers.append(reader)
            mp = MeterProvider(metric_readers=readers, resource=backends.resource(spec))
    resource = getattr(tp, "resource", None)
    specs = _sink_specs(tp is not None and {"tracer_provider": tp},
                        mp is not None and {"meter_provider": mp}, extra, path, opts,
                        dict(resource.attributes) if resource is not None else None)
    sink_health = Health()
    fanout = Fanout(sink_health, sinkbase.build(specs, sink_health))
    store = fanout.named.get("store")
    if store is not None and isinstance(tp, TracerProvider):
        tp.add_span_processor(StoreSpanProcessor(store.put_span, health))
    tel = Telemetry(recorder, Pipeline(recorder, InlineTransport(fanout), health,
                                       opts.drain_interval_s), health, path, "inline")
    tel.sinks = tuple(fanout.named)
    tel.tracer_provider, tel.meter_provider = tp, mp
    tel.memory_exporter, tel.metric_reader = mem_exp, reader
    tel.adopt(owned=[p for p, given in ((tp, tracer_provider), (mp, meter_provider))
                     if p is not None and given is None],
              borrowed=[p for p in (tracer_provider, meter_provider) if p is not None])
    if capture_host_spans and tracer_provider is None and isinstance(tp, TracerProvider):
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(tp)
    return tel


def _close_at_exit(tel: Telemetry) -> None:
    ref = weakref.ref(tel)

    def close() -> None:
        t = ref()
        if t is not None and not t.closed:
            t.close(timeout_s=10.0)

    atexit.register(close)
