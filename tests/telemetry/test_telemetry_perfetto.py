"""Chrome / Perfetto trace-event export of a store."""

from __future__ import annotations

import json

import pytest

from radixscope import telemetry
from tests.kits.cachekit import Driver
from tests.kits.telkit import Rig


def test_export_has_op_slices_transfer_slices_flows_counters_spans_and_marks(tmp_path):
    rig = Rig(tmp_path, ("full", "swa"), device_tokens=24, host_tokens=48)
    c, d = rig.cache, Driver(rig.cache)
    with rig.tracer.start_as_current_span("request"):
        for i in range(4):
            d.insert([1, 2, 3, i, 9], req_id=f"r{i}")
            c.poll()
            rig.tel.flush()
    c.evict(6)
    rig.tel.record_violation("boom", details={"node": 1})
    rig.tel.record_admission("r9", True)
    rig.close()
    out = tmp_path / "trace.json"
    counts = telemetry.export_perfetto(rig.store_path, out)
    doc = json.loads(out.read_text())
    evs = doc["traceEvents"]
    with telemetry.open_store(rig.store_path) as r:
        ops = r.ops()
        n_samples = len(r.metrics())
    slices = [e for e in evs if e["ph"] == "X"]
    assert counts["ops"] + counts["transfers"] == len(slices) == len(ops)
    assert counts["transfers"] == (ops["op"] == "transfer").sum() == 4
    assert sorted(e["name"] for e in slices if e["cat"] == "transfer") == ["backup"] * 4
    assert {e["args"]["op_id"] for e in slices} == set(ops["op_id"])
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    # flows from the enqueuing op to each transfer
    starts = [e for e in evs if e["ph"] == "s"]
    ends = [e for e in evs if e["ph"] == "f"]
    assert len(starts) == len(ends) == 4
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    # one counter track per component x tier, with the pool figures
    counters = [e for e in evs if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"full/device", "full/host", "swa/device",
                                             "swa/host"}
    assert len(counters) == counts["counters"] == n_samples
    assert set(counters[0]["args"]) == {"available", "evictable", "protected", "in_flight",
                                        "held"}
    # the host's request span, and the marks
    assert [e["name"] for e in evs if e["ph"] == "b"] == ["request"]
    assert [e["name"] for e in evs if e["ph"] == "i"] == ["violation:invariant",
                                                          "event:admission"]
    names = {e["args"]["name"] for e in evs if e["ph"] == "M"}
    assert {"radixscope cache", "spans", "ops", "transfers"} <= names
    # slices on one track never overlap (lanes)
    by_tid: dict[int, list] = {}
    for e in slices:
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:], strict=False))


def test_export_of_a_missing_store_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.db"):
        telemetry.export_perfetto(tmp_path / "nope.db", tmp_path / "t.json")
