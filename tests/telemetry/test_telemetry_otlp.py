"""OTLP, end to end: the exporters ``telemetry.setup`` configures from the standard ``OTEL_*``
variables deliver every cache operation's span (names, attributes, parents: engine request
span -> cache op spans) and the metrics to a collector inside the test, over gRPC and HTTP; a
collector that goes away mid-run costs nothing but counted drops.

The run: the engine's ``chat`` workload with its request spans on setup's tracer provider. At
the step where the third request ends, telemetry is flushed, what the collector holds is compared with what an
in-memory exporter on the same provider holds, and the collector is stopped; the run goes on.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from radixscope import telemetry
from radixscope.engine import names as en
from radixscope.engine.run import RunSpec, _build
from radixscope.telemetry import names as n
from tests.kits import otlp_receiver
from tests.kits.otlp_receiver import attributes

STOP_AFTER_DONE = 3  # requests ended (their spans too) when the collector goes away


def _hex(b: bytes) -> str:
    return b.hex()


def _sdk_attrs(span) -> dict:
    return {k: tuple(v) if isinstance(v, list | tuple) else v
            for k, v in dict(span.attributes).items()}


@pytest.fixture(params=sorted(otlp_receiver.PROTOCOLS))
def collector(request, monkeypatch):
    for var in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
                "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_COMPRESSION",
                "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)
    col = otlp_receiver.start(request.param)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", otlp_receiver.PROTOCOLS[request.param])
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # seconds: bounds a failing export
    col.protocol = request.param
    try:
        yield col
    finally:
        col.stop()  # idempotent for both servers


def test_spans_and_metrics_reach_the_collector_and_its_loss_costs_only_counted_drops(
        collector, tmp_path) -> None:
    memory = InMemorySpanExporter()
    tel = telemetry.setup(store=None, mode="inline", span_exporters=[memory],
                          capture_host_spans=False)
    assert tel.tracer_provider is not None
    spec = RunSpec(workload="chat", requests=16, seed=3,
                   sizes={"device_tokens": 512, "host_tokens": 2048})
    seen: dict = {}

    def at_step(engine) -> None:
        if seen or len(engine.done) < STOP_AFTER_DONE:
            return
        seen["step"] = engine.step_no
        tel.flush()
        seen["memory"] = list(memory.get_finished_spans())
        seen["spans"] = collector.got.spans()
        seen["metrics"] = collector.got.metric_points()
        seen["stats"] = tel.stats()
        collector.stop()
        t0 = time.monotonic()
        tel.flush()  # exports to a collector that is gone: bounded, counted, never raised
        seen["flush_s"] = time.monotonic() - t0

    engine, _counter, _cache, _cfg = _build(spec, tel.recorder, None, [at_step], tel)
    engine.tracer = tel.tracer_provider.get_tracer(n.INSTRUMENTATION_SCOPE)
    try:
        engine.run()
    finally:
        final = tel.close(timeout_s=30)
    assert seen, "the run ended before the collector was stopped"
    assert engine.step_no > seen["step"] + 1 and engine.finished and engine.done

    # ---- before the stop: exactly what the provider produced arrived, nothing lost ----------
    assert seen["stats"]["failures"] == {} and not any(seen["stats"]["dropped"].values())
    got = {_hex(s.span_id): (res, s) for res, s in seen["spans"]}
    want = {format(s.context.span_id, "016x"): s for s in seen["memory"]}
    assert set(got) == set(want) and len(seen["spans"]) == len(want)
    ops = [s for s in want.values() if s.name.startswith(n.SPAN_PREFIX)]
    requests = {k: s for k, s in want.items() if s.name == en.span_name(engine.model_name)}
    assert ops and requests
    for sid, s in want.items():
        res, o = got[sid]
        assert res["service.name"] == n.DEFAULT_SERVICE_NAME
        assert o.name == s.name and _hex(o.trace_id) == format(s.context.trace_id, "032x")
        assert attributes(o.attributes) == _sdk_attrs(s)
        assert o.start_time_unix_nano == s.start_time and o.end_time_unix_nano == s.end_time
        parent = format(s.parent.span_id, "016x") if s.parent is not None else ""
        assert _hex(o.parent_span_id) == parent
    # every op span carries its exact name and the attributes every op has
    assert {s.name for s in ops} <= set(n.SPAN_NAMES.values())
    assert {n.SPAN_MATCH, n.SPAN_INSERT, n.SPAN_LOCK, n.SPAN_UNLOCK} <= {s.name for s in ops}
    for s in ops:
        assert {n.ATTR_OP_ID, n.ATTR_SEQ, n.ATTR_OP_MUTATIONS} <= set(s.attributes)
    op_ids = sorted(s.attributes[n.ATTR_OP_ID] for s in ops)
    assert op_ids == list(range(op_ids[0], op_ids[0] + len(op_ids)))  # no op without a span
    # the engine's request span is the parent of the cache ops made for that request
    by_rid = {s.attributes[en.REQUEST_ID]: k for k, s in requests.items()}
    parented = [s for s in ops if s.attributes.get(n.ATTR_REQUEST_ID) in by_rid
                and s.name == n.SPAN_MATCH]
    assert parented
    for s in parented:
        rid = s.attributes[n.ATTR_REQUEST_ID]
        _, o = got[format(s.context.span_id, "016x")]
        assert _hex(o.parent_span_id) == by_rid[rid]
        assert o.trace_id == got[by_rid[rid]][1].trace_id
    # ---- the metrics ------------------------------------------------------------------------
    points = seen["metrics"]
    assert {n.M_LOOKUP_TOKENS, n.M_HIT_TOKENS, n.M_OP_DURATION, n.M_POOL_CAPACITY,
            n.M_TELEMETRY_DROPPED} <= set(points)
    durations = points[n.M_OP_DURATION]
    assert {attributes(p.attributes)[n.LABEL_OP] for p in durations} >= {"match", "insert"}
    # a cumulative counter is exported again by every periodic export: the total is the newest
    # point of each attribute set, not the sum over exports
    newest: dict[tuple, Any] = {}
    for p in points[n.M_LOOKUP_TOKENS]:
        key = tuple(sorted(attributes(p.attributes).items()))
        if key not in newest or p.time_unix_nano >= newest[key].time_unix_nano:
            newest[key] = p
    lookups = sum(p.as_int for p in newest.values())
    assert lookups == sum(s.attributes[n.ATTR_KEY_TOKENS] for s in ops
                          if s.name == n.SPAN_MATCH)

    # ---- after the stop: the run completed; the loss is counted, and only spans -------------
    assert seen["flush_s"] < 20
    stage = "exporter.OTLPSpanExporter"
    assert final["failures"].get(stage, 0) >= 1, final
    assert final["dropped"]["span"] >= 1
    assert {k: v for k, v in final["dropped"].items() if k != "span"} == dict.fromkeys(
        (k for k in final["dropped"] if k != "span"), 0)
    assert set(final["failures"]) <= {stage, "exporter.OTLPMetricExporter"}
    assert len(collector.got.spans()) == len(seen["spans"])  # nothing arrived after the stop
