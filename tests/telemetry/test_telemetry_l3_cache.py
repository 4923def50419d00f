"""The L3 tier everywhere, on the real cache (StorageSetup over a file backend) with
``tel.prefetch_observer``: spans linked to the request, metrics per tier, the store's journal
and ``prefetch`` op records, the miss explainer's "in storage, prefetch stopped at N tokens",
the doctor and a crash bundle with the pending prefetch."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.storage import FileBackend, PrefetchConfig
from radixscope.cache.storage import prefetch_events as pe
from radixscope.cache.storage.setup import StorageSetup
from radixscope.cache.tiers import STORAGE
from radixscope.telemetry import names as n
from radixscope.telemetry.analysis import storage_doctor as sd
from radixscope.telemetry.analysis.load import load, load_bundle
from radixscope.telemetry.analysis.miss.explain import explain_miss
from radixscope.telemetry.capture.bundle import write_bundle
from tests.kits.cachekit import Driver, make_config
from tests.kits.l3kit import evict_everything, wait_prefetch
from tests.kits.prefetchkit import Gate
from tests.kits.telkit import by_labels, metric_points

PAGE = 4
TOKENS = list(range(1, 1 + 12 * PAGE))  # 12 pages


def _cache(tmp: Path, tel, backend=None, write_policy: str = "write_through", **pf
           ) -> HiRadixCache:
    cfg = make_config(("full",), page_size=PAGE, device_tokens=64 * PAGE, host_tokens=128 * PAGE)
    conf = PrefetchConfig(**{"policy": "wait_complete", "threshold_tokens": PAGE,
                             "batch_pages": 4, "max_host_share": 1.0, **pf})
    be = backend if backend is not None else FileBackend(tmp / "l3")
    return HiRadixCache(cfg, tel.recorder, storage=StorageSetup(
        be, write_policy=write_policy, prefetch=conf, observer=tel.prefetch_observer))


def _written(c: HiRadixCache) -> None:
    Driver(c).insert(TOKENS, req_id="writer")
    c.poll(wait=True)
    evict_everything(c)


def test_prefetch_from_storage_in_spans_metrics_and_the_store(tmp_path):
    tel = telemetry.setup(store=tmp_path / "run.db", in_memory=True, capture_host_spans=False)
    c = _cache(tmp_path, tel)
    _written(c)
    tracer = tel.tracer_provider.get_tracer("tests.engine")
    with tracer.start_as_current_span("request") as req:
        m = c.match_prefix(TOKENS, req_id="r1", prefetch=True)
        assert m.prefetch_status == "started"
    wait_prefetch(c, "r1")
    m = c.match_prefix(TOKENS, req_id="r1", prefetch=True)
    assert m.storage_hit_length == len(TOKENS)
    tel.flush()
    spans = list(tel.memory_exporter.get_finished_spans())
    (pf,) = [s for s in spans if s.name == n.SPAN_STORAGE_PREFETCH]
    assert pf.parent.span_id == req.get_span_context().span_id
    assert (pf.attributes[n.ATTR_PREFETCH_REASON], pf.attributes[n.ATTR_PREFETCH_HIT_TOKENS]) == (
        pe.R_COMPLETE, len(TOKENS))
    gets = [s for s in spans if s.name == n.SPAN_STORAGE_GET]
    assert len(gets) == 3 and all(s.parent.span_id == pf.context.span_id for s in gets)
    hand_back = [s for s in spans if s.name == n.SPAN_PREFETCH]
    assert [s.attributes[n.ATTR_PREFETCH_HIT_TOKENS] for s in hand_back] == [len(TOKENS)]
    pts = metric_points(tel.metric_reader)
    hits = {k: p.value for k, p in by_labels(pts[n.M_HIT_TOKENS], n.LABEL_COMPONENT,
                                             n.LABEL_TIER).items()}
    assert hits[("full", "storage")] == len(TOKENS)
    assert {k: p.value for k, p in by_labels(pts[n.M_STORE_TOKENS],
                                             n.LABEL_COMPONENT).items()} == {("full",): 48}
    assert sum(p.value for p in pts[n.M_STORE_BYTES]) > 0
    assert sum(p.value for p in pts[n.M_PREFETCH_TOKENS]) == len(TOKENS)
    c.storage_close()
    tel.close()
    with telemetry.open_store(tmp_path / "run.db") as r:
        ops = r.ops()
        pf_ops = ops[ops["op"] == ev.OP_PREFETCH]
        a = pf_ops.iloc[-1]["attrs"]
        assert (a[ev.A_PREFETCH_REASON], a[ev.A_PREFETCH_HIT]) == (pe.R_COMPLETE, len(TOKENS))
        final = r.state_at(r.last_seq())
        stored = [nd for nd in final.nodes if nd.components[0].lens[STORAGE] is not None]
        assert sum(nd.components[0].lens[STORAGE] for nd in stored) == len(TOKENS)
        kinds = set(r.events()["kind"])
        assert {pe.PREFETCH_START, pe.PREFETCH_END, pe.STORAGE_EXISTS, pe.STORAGE_GET} <= kinds


def test_miss_explainer_says_the_prefetch_stopped_at_its_deadline(tmp_path):
    inner = FileBackend(tmp_path / "l3")
    gate = Gate(inner, hold=lambda n_get, keys: n_get >= 2)  # the second FULL batch hangs
    tel = telemetry.setup(store=tmp_path / "run.db", mode="inline", metrics=False,
                          capture_host_spans=False)
    c = _cache(tmp_path, tel, backend=gate, policy="timeout", timeout_base_s=0.05,
               timeout_per_ki_token_s=0.0)
    try:
        _written(c)
        assert c.match_prefix(TOKENS, req_id="r2", prefetch=True).prefetch_status == "started"
        assert gate.entered.wait(10)
        wait_prefetch(c, "r2")
        st = c.prefetch_state("r2")
        assert (st.reason, st.hit_tokens) == (pe.R_DEADLINE, 4 * PAGE)
        m = c.match_prefix(TOKENS, req_id="r2")
        assert m.device_indices.numel() == 0 and m.host_hit_length == 4 * PAGE
    finally:  # a failed assertion must not leave the worker held at the gate
        gate.release()
        c.storage_close()
        tel.close()
    with load(tmp_path / "run.db") as src:
        x = explain_miss(src, "r2", tokens=TOKENS)
    (r,) = [r for r in x.reasons if r.tier == "storage"]
    assert r.code == "in_storage"
    assert r.text.startswith(f"in storage, prefetch stopped at {4 * PAGE} tokens (deadline after ")
    assert f"storage held {len(TOKENS)} of the {len(TOKENS)} tokens asked" in r.text
    assert r.detail()["reason"] == pe.R_DEADLINE


def test_bundle_and_doctor_see_a_pending_prefetch_and_no_leaked_pin(tmp_path):
    inner = FileBackend(tmp_path / "l3")
    gate = Gate(inner, hold=lambda n_get, keys: True)
    tel = telemetry.setup(store=None, mode="inline", metrics=False, spans=False,
                          capture_host_spans=False)
    c = _cache(tmp_path, tel, backend=gate)
    _written(c)
    Driver(c).insert(TOKENS[:2 * PAGE], req_id="again")  # two pages back on host: the anchor
    c.poll(wait=True)
    c.evict(10**9)
    assert c.match_prefix(TOKENS, req_id="held", prefetch=True).prefetch_status == "started"
    assert gate.entered.wait(10)
    path = write_bundle(c, tmp_path / "b.db")
    with load_bundle(path) as b:
        pend = b.prefetches()
        snap = b.snapshot()
    assert list(pend["req_id"]) == ["held"]
    assert int(pend["asked_tokens"][0]) == len(TOKENS) - 2 * PAGE
    assert any(lk.owner == "prefetch:held" and lk.tier == "host" for lk in snap.locks)
    now = int(pend["started_ns"][0])
    assert sd.storage_findings(snap, pend, now) == []  # running, pinned: nothing wrong
    zero = PrefetchConfig(timeout_base_s=0.0, timeout_per_ki_token_s=0.0)
    (f,) = sd.storage_findings(snap, pend, now + 1, zero)
    assert f.subject == "prefetch held"
    # the same pin once the prefetch is no longer pending is a leak
    (leak,) = sd.storage_findings(snap, pend.iloc[0:0], now)
    assert leak.message.startswith("leaked host pin: 'prefetch:held'")
    gate.release()
    c.storage_close()
    tel.close()


def test_hand_back_op_names_are_the_explainers():
    from radixscope.telemetry.analysis.miss import storage as ms
    assert (ms.OP_PREFETCH, ms.A_HIT, ms.A_FOUND) == (ev.OP_PREFETCH, ev.A_PREFETCH_HIT,
                                                      ev.A_PREFETCH_FOUND)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_store_writes_in_spans_metrics_and_the_store(tmp_path, policy):
    """Every ``batch_set`` the cache makes (the writer thread's write-through stores, the
    synchronous write-back before host eviction) is a ``storage.set`` event: a
    ``kv_cache.storage_set`` span, the set-side page / byte metrics and a store event."""
    tel = telemetry.setup(store=tmp_path / "run.db", in_memory=True, capture_host_spans=False)
    c = _cache(tmp_path, tel, write_policy=policy)
    _written(c)
    w = c.storage_stats().writes
    assert (w.pages_stored, w.write_back_pages) == ((12, 0) if policy == "write_through"
                                                     else (0, 12))
    tel.flush()
    sets = [s for s in tel.memory_exporter.get_finished_spans()
            if s.name == n.SPAN_STORAGE_SET]
    assert sets and all(s.attributes[n.ATTR_STORAGE_STATUS] == "ok" for s in sets)
    pts = metric_points(tel.metric_reader)
    pages = {k: p.value for k, p in by_labels(pts[n.M_STORAGE_PAGES], n.LABEL_STORAGE_OP,
                                              n.LABEL_STORAGE_STATUS, n.LABEL_COMPONENT).items()}
    assert pages == {("set", "ok", "full"): 12}
    nbytes = {k: p.value for k, p in by_labels(pts[n.M_STORAGE_BYTES], n.LABEL_STORAGE_OP,
                                               n.LABEL_COMPONENT).items()}
    assert nbytes[("set", "full")] > 0
    assert c._writer.observer_errors == 0
    c.storage_close()
    tel.close()
    with telemetry.open_store(tmp_path / "run.db") as r:
        ev_set = r.events(pe.STORAGE_SET)
    assert sum(a[pe.A_PAGES] for a in ev_set["attrs"]) == 12


def test_a_failing_observer_never_breaks_a_store_write(tmp_path):
    class Boom(pe.ListObserver):
        def event(self, e: tuple) -> None:
            if e[0] == pe.STORAGE_SET:
                raise RuntimeError("boom")
            super().event(e)

    cfg = make_config(("full",), page_size=PAGE, device_tokens=64 * PAGE, host_tokens=128 * PAGE)
    c = HiRadixCache(cfg, storage=StorageSetup(FileBackend(tmp_path / "l3"), observer=Boom()))
    _written(c)
    assert c.storage_stats().writes.pages_stored == 12  # the store landed all the same
    assert c._writer.observer_errors >= 1
    c.check()
    c.storage_close()
