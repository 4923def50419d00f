"""``telemetry.setup``: backends chosen from arguments and the standard OTEL_* variables,
console and OTLP exporters, process mode with an exporter, in-memory mode, the auto store."""

from __future__ import annotations

import sys

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.telemetry import names as n
from radixscope.telemetry.sinks import otel_exporters as backends
from tests.kits.cachekit import Driver, make_config


def test_otlp_from_env():
    f = backends.otlp_from_env
    assert f({}) == (None, None)
    assert f({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == ("http/protobuf",
                                                                   "http/protobuf")
    assert f({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
              "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == ("grpc", "grpc")
    assert f({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317",
              "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}) == ("grpc", None)
    assert f({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}) == (
        None, "http/protobuf")
    with pytest.raises(ValueError, match="'http/json'"):
        f({"OTEL_EXPORTER_OTLP_ENDPOINT": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_exporters_built_for_each_protocol():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    for proto, cls in (("grpc", GrpcExporter), ("http/protobuf", HttpExporter)):
        (exp,) = backends.span_exporters(backends.BackendSpec(otlp_traces=proto))
        assert isinstance(exp, cls)
        exp.shutdown()
    (exp,) = backends.span_exporters(backends.BackendSpec(console=True))
    assert isinstance(exp, ConsoleSpanExporter)
    with pytest.raises(ValueError, match="otlp_traces="):
        backends.BackendSpec(otlp_traces="carrier-pigeon")


@pytest.mark.parametrize("signal", ["traces", "metrics"])
def test_unreachable_otlp_collector_is_counted_not_raised(monkeypatch, signal):
    monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT",
                       f"http://127.0.0.1:9/v1/{signal}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    tel = telemetry.setup(store=None, mode="inline", spans=signal == "traces",
                          metrics=signal == "metrics", capture_host_spans=False)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(c).insert([1, 2, 3])
    stats = tel.close()  # span batches / the metric reader's final export fail: counted
    if signal == "traces":
        assert stats["failures"] == {"exporter.OTLPSpanExporter": 1}
        assert stats["dropped"]["span"] == 5
    else:
        assert stats["failures"].get("exporter.OTLPMetricExporter", 0) >= 1
    c.check()


def test_prometheus_without_its_package_fails_in_setup(monkeypatch):
    # a None entry in sys.modules makes the import fail as if the package were not installed
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.prometheus", None)
    with pytest.raises(ImportError, match="opentelemetry-exporter-prometheus"):
        telemetry.setup(store=None, mode="inline", prometheus=9464)


def test_the_writers_flush_reports_its_cpu_its_collections_and_its_page_faults(tmp_path):
    """For benchmarks (``bench/bench_telemetry.py`` reads the CPU; the twenty-fifth round of
    issue 17 read the collections, ``bench_scale.py`` prints the page faults): the writer
    process's own counters, as of the last flush."""
    tel = telemetry.setup(store=tmp_path / "w.db", capture_host_spans=False)
    try:
        Driver(HiRadixCache(make_config(), recorder=tel.recorder)).insert([4, 5, 6])
        tel.flush()
        proc = tel.pipeline.last_stats["process"]
        assert proc["cpu_s"] > 0
        gens = proc["gc_collections"]
        assert len(gens) == 3 and all(type(g) is int and g >= 0 for g in gens), gens
        assert type(proc["minor_faults"]) is int and proc["minor_faults"] > 0  # (it started)
    finally:
        tel.close()


def test_process_mode_exports_sdk_spans_from_the_writer(tmp_path, capfd):
    tel = telemetry.setup(store=tmp_path / "p.db", console=True, capture_host_spans=False)
    assert tel.mode == "process"
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(c).insert([4, 5, 6], req_id="rq")
    c.poll()
    stats = tel.close()
    assert stats["failures"] == {} and sum(stats["dropped"].values()) == 0
    out = capfd.readouterr().out
    for name in (n.SPAN_MATCH, n.SPAN_LOCK, n.SPAN_ALLOC, n.SPAN_INSERT, n.SPAN_UNLOCK,
                 n.SPAN_TRANSFER):
        assert f'"name": "{name}"' in out
    assert '"kv_cache.request.id": "rq"' in out
    with telemetry.open_store(tmp_path / "p.db") as r:
        spans = r.spans()
        assert list(spans["name"]) == [n.SPAN_MATCH, n.SPAN_LOCK, n.SPAN_ALLOC, n.SPAN_INSERT,
                                       n.SPAN_UNLOCK, n.SPAN_TRANSFER]
        ids = set(spans["span_id"])
        assert all(f'"span_id": "0x{i}"' in out for i in ids)  # the exported spans are these
        assert spans["links"].iloc[-1][0][1] == spans["span_id"].iloc[3]  # transfer -> insert
        assert r.state_at(r.last_seq()) == c.snapshot()


def test_in_memory_mode_and_auto_store(tmp_path, monkeypatch):
    tel = telemetry.setup(in_memory=True, capture_host_spans=False)
    assert tel.store_path is None and tel.mode == "inline"
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    c.match_prefix([1, 2])
    tel.flush()
    assert [s.name for s in tel.memory_exporter.get_finished_spans()] == [n.SPAN_MATCH]
    assert tel.metric_reader.get_metrics_data() is not None
    tel.close()
    monkeypatch.chdir(tmp_path)
    tel = telemetry.setup(mode="inline", capture_host_spans=False)
    assert tel.store_path.parent == tmp_path / "runs"
    assert tel.store_path.name.startswith("telemetry-") and tel.store_path.exists()
    tel.close()
    tel = telemetry.setup(store=None, mode="inline", capture_host_spans=False)
    with pytest.raises(ValueError, match="no store"):
        tel.open_store()
    tel.close()


def test_a_dead_writer_process_costs_records_not_the_cache(tmp_path):
    tel = telemetry.setup(store=tmp_path / "w.db", capture_host_spans=False,
                          block_timeout_s=0.1)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    d = Driver(c)
    d.insert([1, 2, 3])
    tel.flush()
    tel.pipeline.transport.process.kill()
    tel.pipeline.transport.process.wait()
    for i in range(20):
        d.insert([1, 2, i])  # 5 ops each, never delivered
        c.poll()
    c.check()
    stats = tel.close(timeout_s=5)
    assert stats["dropped"]["op"] >= 100 - 5  # everything after the kill, give or take a batch
    assert any(k.startswith("drain") for k in stats["failures"])
    with telemetry.open_store(tmp_path / "w.db") as r:  # what was committed stays readable
        assert len(r.ops()) >= 5
