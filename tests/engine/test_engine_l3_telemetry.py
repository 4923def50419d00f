"""``radixscope run --storage`` with telemetry: the engine passes ``tel.prefetch_observer`` to
the cache's L3 tier, so a second run over the same file store leaves, in its store, the
prefetch spans (under each request's span when the run captures host spans: the CLI), the L3
events, the storage-tier hits of its matches and STORAGE lengths in the journal; and the
doctor's L3 section has nothing pending."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from radixscope import telemetry
from radixscope.cache import events as ev
from radixscope.cache.storage import prefetch_events as pe
from radixscope.cache.tiers import STORAGE
from radixscope.engine.doctor import diagnose
from radixscope.engine.run import RunSpec, execute
from radixscope.telemetry import names as n


def test_second_run_records_its_l3_prefetches(tmp_path):
    def spec(store):
        return RunSpec(workload="chat", requests=12, seed=3, store=str(store),
                       check_invariants=True, storage=f"file:{tmp_path / 'l3'}",
                       prefetch_policy="wait_complete", prefetch_threshold=16,
                       telemetry_mode="inline")
    assert execute(spec(tmp_path / "one.db")).ok
    second = execute(spec(tmp_path / "two.db"))
    assert second.ok, second.error
    with telemetry.open_store(tmp_path / "two.db") as r:
        spans = r.spans()
        ops = r.ops()
        events = r.events()
        final = r.state_at(r.last_seq())
    pf = spans[spans["name"] == n.SPAN_STORAGE_PREFETCH]
    ran = pf[pf["attributes"].map(lambda a: n.ATTR_PREFETCH_HIT_TOKENS in a)]
    assert len(ran) > 0 and sum(a[n.ATTR_PREFETCH_HIT_TOKENS] for a in ran["attributes"]) > 0
    gets = spans[spans["name"] == n.SPAN_STORAGE_GET]
    assert len(gets) > 0 and set(gets["parent_span_id"]) <= set(pf["span_id"])
    matches = ops[ops["op"] == ev.OP_MATCH]
    from_l3 = sum(a.get(ev.A_STORAGE_HIT, 0) for a in matches["attrs"])
    assert from_l3 > 0
    handed = ops[ops["op"] == ev.OP_PREFETCH]
    assert sum(a.get(ev.A_PREFETCH_HIT, 0) for a in handed["attrs"]) > 0
    kinds = set(events["kind"])
    assert {pe.PREFETCH_START, pe.PREFETCH_END, pe.STORAGE_EXISTS, pe.STORAGE_GET} <= kinds
    assert any(nd.components[0].lens[STORAGE] for nd in final.nodes)
    report = diagnose(str(tmp_path / "two.db"))
    assert "storage: 0 prefetches pending" in report.text
    assert "leaked host pin" not in report.text and "stuck prefetch" not in report.text


ROOT = Path(__file__).resolve().parents[2]


def test_cli_run_parents_each_prefetch_on_its_request_span(tmp_path):
    """The CLI (process mode: request spans through the global provider into the store)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("one", "two"):
        subprocess.run([sys.executable, "-m", "radixscope.engine.cli", "run", "--workload",
                        "chat", "--requests", "12", "--seed", "3", "--no-progress",
                        "--storage", f"file:{tmp_path / 'l3'}", "--prefetch-threshold", "16",
                        "--prefetch-policy", "wait_complete", "--store",
                        str(tmp_path / f"{name}.db")],
                       cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    with telemetry.open_store(tmp_path / "two.db") as r:
        spans = r.spans()
    pf = spans[spans["name"] == n.SPAN_STORAGE_PREFETCH]
    ran = pf[pf["attributes"].map(lambda a: n.ATTR_PREFETCH_HIT_TOKENS in a)]
    assert len(ran) > 0
    by_id = dict(zip(spans["span_id"], zip(spans["name"], spans["attributes"], strict=True),
                     strict=True))
    for parent, trace_id, a in zip(ran["parent_span_id"], ran["trace_id"], ran["attributes"],
                                   strict=True):
        pname, pattrs = by_id[parent]  # the request's server span, same trace
        assert not pname.startswith("kv_cache.")
        assert a[n.ATTR_REQUEST_ID] in {str(v) for v in pattrs.values()}
        assert trace_id == spans.loc[spans["span_id"] == parent, "trace_id"].iloc[0]
