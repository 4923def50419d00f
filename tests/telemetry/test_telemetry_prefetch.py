"""The prefetch observer: a real PrefetchController over a file backend reports into
``tel.prefetch_observer``; spans through the real OTel SDK, metrics through an in-memory
reader, events into a real store."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider

from radixscope import telemetry
from radixscope.cache.storage import PrefetchConfig
from radixscope.cache.storage import prefetch_events as pe
from radixscope.telemetry import names as n
from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.record.prefetch import TelemetryPrefetchObserver
from tests.kits.prefetchkit import POOL_SETS, P, Rig, drive, settle
from tests.kits.telkit import by_labels, metric_points


@pytest.fixture
def tel():
    t = telemetry.setup(store=None, in_memory=True, capture_host_spans=False)
    yield t
    t.close()


def _spans(tel, name=None):
    tel.flush()
    out = list(tel.memory_exporter.get_finished_spans())
    return [s for s in out if name is None or s.name == name]


def _values(tel, metric, *labels):
    pts = metric_points(tel.metric_reader).get(metric, [])
    return {k: p.value for k, p in by_labels(pts, *labels).items()}


@pytest.mark.parametrize("pools", list(POOL_SETS))
def test_prefetch_span_is_the_request_child_with_storage_calls_under_it(tmp_path, tel, pools):
    rig = Rig(tmp_path, POOL_SETS[pools], n_pages=12)
    rig.write()
    ctl = rig.controller(observer=tel.prefetch_observer)
    tracer = tel.tracer_provider.get_tracer("tests.engine")
    with tracer.start_as_current_span("request") as req:
        assert ctl.start("r1", rig.hashes).started
    (res,) = drive(ctl)
    rig.verify(res)
    assert res.reason == pe.R_COMPLETE and res.tokens == 12 * P
    (pf,) = _spans(tel, n.SPAN_STORAGE_PREFETCH)
    assert pf.parent.span_id == req.get_span_context().span_id
    assert pf.context.trace_id == req.get_span_context().trace_id
    a = pf.attributes
    assert a[n.ATTR_REQUEST_ID] == "r1"
    assert a[n.ATTR_PREFETCH_REASON] == pe.R_COMPLETE
    assert (a[n.ATTR_PREFETCH_ASKED_TOKENS], a[n.ATTR_PREFETCH_HIT_TOKENS],
            a[n.ATTR_PREFETCH_FOUND_TOKENS]) == (12 * P, 12 * P, 12 * P)
    # batch_pages=4: three FULL batches, progress 16, 32, 48 tokens
    assert [e.attributes[n.ATTR_PREFETCH_COMPLETED_TOKENS] for e in pf.events
            if e.name == n.EVENT_PREFETCH_PROGRESS] == [4 * P, 8 * P, 12 * P]
    (ex,) = _spans(tel, n.SPAN_STORAGE_EXISTS)
    gets = _spans(tel, n.SPAN_STORAGE_GET)
    assert len(gets) == 3 + len(POOL_SETS[pools])  # FULL batches, then one per pool
    for s in (ex, *gets):
        assert s.parent.span_id == pf.context.span_id
        assert pf.start_time <= s.start_time <= s.end_time <= pf.end_time
        assert s.attributes[n.ATTR_STORAGE_STATUS] == "ok"
        assert s.attributes[n.ATTR_STORAGE_BACKEND] == rig.store.name
    assert ex.attributes[n.ATTR_PREFETCH_FOUND_TOKENS] == 12 * P
    assert sorted({s.attributes[n.ATTR_COMPONENT] for s in gets}) == sorted(
        ("full", *POOL_SETS[pools]))
    rig.free(res)
    ctl.close()


def test_declined_and_partial_prefetches_in_spans_and_metrics(tmp_path, tel):
    rig = Rig(tmp_path, ("swa",), n_pages=12)
    rig.write(pages=5)  # storage holds 5 of 12 pages
    ctl = rig.controller(observer=tel.prefetch_observer)
    assert ctl.start("short", rig.hashes[:1]).reason == pe.R_BELOW_THRESHOLD
    assert ctl.start("r2", rig.hashes).started
    (res,) = drive(ctl)
    rig.verify(res)
    assert (res.tokens, res.reason) == (5 * P, pe.R_STORAGE_MISS)
    settle(ctl)
    spans = _spans(tel, n.SPAN_STORAGE_PREFETCH)
    by_req = {s.attributes[n.ATTR_REQUEST_ID]: s for s in spans}
    assert by_req["short"].attributes[n.ATTR_PREFETCH_REASON] == pe.R_BELOW_THRESHOLD
    assert by_req["short"].start_time == by_req["short"].end_time
    assert by_req["r2"].attributes[n.ATTR_PREFETCH_HIT_TOKENS] == 5 * P
    st = ctl.stats()
    assert _values(tel, n.M_PREFETCH_UNFULFILLED, n.LABEL_PREFETCH_REASON) == {
        (k,): v for k, v in st.unfulfilled.items()} == {
        (pe.R_BELOW_THRESHOLD,): P, (pe.R_STORAGE_MISS,): 7 * P}
    assert _values(tel, n.M_PREFETCH_TOKENS, n.LABEL_COMPONENT) == {
        ("full",): st.prefetched_tokens} == {("full",): 5 * P}
    assert _values(tel, n.M_PREFETCH_FOUND_TOKENS, n.LABEL_COMPONENT) == {("full",): 5 * P}
    assert _values(tel, n.M_HIT_TOKENS, n.LABEL_COMPONENT, n.LABEL_TIER) == {}  # match ops'
    assert _values(tel, n.M_PREFETCH_ENDED, n.LABEL_PREFETCH_REASON) == {
        (pe.R_STORAGE_MISS,): 1}
    got = _values(tel, n.M_STORAGE_BYTES, n.LABEL_STORAGE_OP, n.LABEL_COMPONENT)
    assert sum(got.values()) == st.bytes_read > 0
    assert set(got) == {("get", "full"), ("get", "swa")}
    pages = _values(tel, n.M_STORAGE_PAGES, n.LABEL_STORAGE_OP, n.LABEL_STORAGE_STATUS,
                    n.LABEL_COMPONENT)
    assert pages[("exists", "ok", "full")] == 12
    assert pages[("get", "ok", "full")] == 5
    bw = by_labels(metric_points(tel.metric_reader)[n.M_STORAGE_BANDWIDTH],
                   n.LABEL_STORAGE_OP, n.LABEL_COMPONENT)
    assert bw[("get", "full")].count >= 1 and bw[("get", "full")].sum > 0
    for name, points in metric_points(tel.metric_reader).items():
        for p in points:
            assert set(p.attributes) == set(n.METRIC_LABELS[name]), name
    rig.free(res)
    ctl.close()


def test_aborted_prefetch_ends_its_span_and_counts_aborted(tmp_path, tel):
    rig = Rig(tmp_path, (), n_pages=8)
    rig.write()
    ctl = rig.controller(config=PrefetchConfig(threshold_tokens=2 * P, batch_pages=4),
                         observer=tel.prefetch_observer)
    assert ctl.start("gone", rig.hashes).started
    assert tel.prefetch_observer.pending() == ["gone"]
    assert ctl.abort("gone")
    settle(ctl)
    assert tel.prefetch_observer.pending() == []
    (pf,) = _spans(tel, n.SPAN_STORAGE_PREFETCH)
    assert pf.attributes[n.ATTR_PREFETCH_REASON] == pe.R_ABORTED
    assert pf.attributes[n.ATTR_PREFETCH_HIT_TOKENS] == 0
    assert _values(tel, n.M_PREFETCH_UNFULFILLED, n.LABEL_PREFETCH_REASON) == {
        (k,): v for k, v in ctl.stats().unfulfilled.items()} == {(pe.R_ABORTED,): 8 * P}
    assert rig.all_free()
    ctl.close()


def test_bind_request_parents_a_prefetch_started_outside_the_request(tmp_path, tel):
    rig = Rig(tmp_path, (), n_pages=4)
    rig.write()
    ctl = rig.controller(observer=tel.prefetch_observer)
    tracer = tel.tracer_provider.get_tracer("tests.engine")
    with tracer.start_as_current_span("request") as req:
        tel.prefetch_observer.bind_request("r3")
    assert ctl.start("r3", rig.hashes).started  # outside the span
    (res,) = drive(ctl)
    (pf,) = _spans(tel, n.SPAN_STORAGE_PREFETCH)
    assert pf.parent.span_id == req.get_span_context().span_id
    rig.free(res)
    ctl.close()


def test_events_reach_the_store_in_process_mode(tmp_path):
    tel = telemetry.setup(store=tmp_path / "t.db", capture_host_spans=False)
    try:
        rig = Rig(tmp_path, (), n_pages=6)
        rig.write(pages=4)
        ctl = rig.controller(observer=tel.prefetch_observer)
        assert ctl.start("rp", rig.hashes).started
        (res,) = drive(ctl)
        rig.free(res)
        ctl.close()
        tel.flush()
        with tel.open_store() as r:
            ev = r.events()
        kinds = list(ev["kind"])
        assert kinds[0] == pe.PREFETCH_START and kinds[-1] == pe.PREFETCH_END
        assert pe.STORAGE_EXISTS in kinds and pe.STORAGE_GET in kinds
        assert pe.PREFETCH_PROGRESS not in kinds
        end = ev[ev["kind"] == pe.PREFETCH_END].iloc[0]
        attrs = end["attrs"] if isinstance(end["attrs"], dict) else __import__("json").loads(
            end["attrs"])
        assert (attrs["req_id"], attrs["asked_tokens"], attrs[pe.A_TOKENS],
                attrs[pe.A_REASON]) == ("rp", 6 * P, 4 * P, pe.R_STORAGE_MISS)
    finally:
        tel.close()


class _Broken(TracerProvider):
    def get_tracer(self, *a, **k):
        raise RuntimeError("tracer provider is broken")


def test_a_failing_observer_never_reaches_the_controller(tmp_path):
    health = Health()
    obs = TelemetryPrefetchObserver(None, health, tracer_provider=_Broken())
    rig = Rig(tmp_path, ("mamba",), n_pages=4)
    rig.write()
    ctl = rig.controller(observer=obs)
    assert ctl.start("rx", rig.hashes).started
    (res,) = drive(ctl)
    rig.verify(res)
    assert res.reason == pe.R_COMPLETE
    assert ctl.observer_errors == 0
    assert health.snapshot()["failures"]["prefetch_observer"] >= 2
    rig.free(res)
    ctl.close()


def test_observer_is_thread_safe_under_concurrent_events(tel):
    obs = tel.prefetch_observer
    reqs = [f"t{i}" for i in range(40)]

    def run(req: str) -> None:
        obs.event((pe.PREFETCH_START, req, 1_000, {pe.A_TOKENS: 8, pe.A_REASON: "started"}))
        for k in range(5):
            obs.event((pe.PREFETCH_PROGRESS, req, 1_100 + k, {pe.A_COMPLETED: k}))
            obs.event((pe.STORAGE_GET, req, 1_200 + k, {pe.A_PAGES: 1, pe.A_SECONDS: 1e-7,
                                                        pe.A_STATUS: "ok"}))
        obs.event((pe.PREFETCH_END, req, 2_000, {pe.A_TOKENS: 8, pe.A_REASON: "complete",
                                                 pe.A_HIT_TOKENS: 8}))

    threads = [threading.Thread(target=run, args=(r,)) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = _spans(tel)
    pfs = [s for s in spans if s.name == n.SPAN_STORAGE_PREFETCH]
    assert sorted(s.attributes[n.ATTR_REQUEST_ID] for s in pfs) == sorted(reqs)
    parent = {s.context.span_id: s.attributes[n.ATTR_REQUEST_ID] for s in pfs}
    gets = [s for s in spans if s.name == n.SPAN_STORAGE_GET]
    assert len(gets) == 200
    assert all(parent[s.parent.span_id] == s.attributes[n.ATTR_REQUEST_ID] for s in gets)
    assert all(len(s.events) == 5 for s in pfs)
    assert tel.stats()["failures"].get("prefetch_observer", 0) == 0
