"""The bug zoo (issue 18): each crash class, injected into an engine run, is caught within one
cache operation of the op where the buggy variant fired, a bundle names the op, seq, nodes and
rule, and the post-mortem notebook run on that bundle prints them. The same runs without an
injection raise nothing and record no violation. ``--inject`` with an unknown name is one line,
exit 2, listing the zoo."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from radixscope.cache import zoo
from radixscope.engine.cli import main
from radixscope.engine.run import execute
from radixscope.telemetry import open_store
from radixscope.telemetry.analysis.load import load, load_bundle
from radixscope.telemetry.analysis.postmortem import (
    failure_point,
    failure_summary,
    ops_before_failure,
)
from tests.kits.zookit import CLEAN, L3_STORE, ROOT, ZOO, prepare, record, spec
from tests.telemetry.test_postmortem_notebook import NOTEBOOK, inject, outputs


def _notebook_text(bundle) -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    inject(nb, path=str(bundle))
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    text, errors = outputs(nb)
    assert errors == []
    return text


def test_the_zoo_lists_every_engine_class():
    assert sorted(f.number for f in zoo.faults("cache").values()) == list(range(1, 11))
    assert sorted(f.number for f in zoo.faults().values()) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert set(ZOO) == set(zoo.names())


@pytest.mark.parametrize("name", list(ZOO))
def test_each_class_is_caught_within_one_op_bundled_and_explained(name, tmp_path):
    settings, rule, op = ZOO[name]
    store = tmp_path / "run.db"
    prepare(settings, store)
    r = execute(spec(settings, store), inject=name)
    assert r.error is not None and not r.ok
    inj = r.injection
    assert inj.fired, "the buggy variant never fired"
    fired = inj.last_fired_before(r.detected_op_id)
    ops_to_detection = r.detected_op_id - fired.op_id
    assert 0 <= ops_to_detection <= 1
    v = r.violation
    assert v["rule"] == rule and v["op_id"] == r.detected_op_id
    if op is not None:
        assert v["op"] == op
    assert v["nodes"], "the report names no node"
    # the report's bundle names the op, its seqs, the nodes and the rule (when the faulty op
    # itself then crashed, the cache's hook bundled that crash first, in the same op)
    assert len(r.bundles) >= 1
    failures = []
    for path in r.bundles:
        with load_bundle(path) as b:
            failures.append((path, b.failure()))
    bundle, f = next(((p, x) for p, x in failures if x["rule"] == rule), failures[0])
    assert (f["rule"], f["op"], f["op_id"]) == (rule, v["op"], r.detected_op_id)
    assert f["nodes"] and f["node"] == f["nodes"][0]
    assert f["op_seqs"] is not None and f["op_seqs"][1] <= f["seq"]
    # the store: the injection event and the engine's report (what the Health page reads)
    with open_store(store) as reader:
        events = reader.events("zoo.inject")
        rows = reader.violations()
    assert list(events["attrs"])[0]["name"] == name
    mine = rows[rows["kind"] == r.error_kind]
    assert list(mine["message"]) == [r.error]  # once: a strict run's stop records it alone
    details = mine["details"].iloc[-1]
    assert details["rule"] == rule and details["op_id"] == r.detected_op_id
    assert details["injection"]["fired"]
    # the post-mortem on the store itself (no bundle) follows the same recorded violation
    with load(store) as rec:
        text = failure_summary(rec)
        at = failure_point(rec)[1]
        last_op = ops_before_failure(rec)["op_id"].iloc[-1]
    assert f"FAILED OP: {v['op']} (op {r.detected_op_id}" in text
    assert f"RULE: {rule}" in text.splitlines()
    assert at == int(mine["seq"].iloc[-1]) and last_op == r.detected_op_id
    # the notebook, run on the bundle, prints the op, the node and the rule
    text = _notebook_text(bundle)
    assert f"FAILED OP: {f['op']} (op {f['op_id']}" in text
    assert f"NODE: {f['node']}\n" in text and f"RULE: {rule}\n" in text
    record(name, {"class": inj.fault.number, "rule": rule, "op": f["op"],
                  "op_id": f["op_id"], "fired_op_id": fired.op_id,
                  "ops_to_detection": ops_to_detection, "firings": len(inj.fired),
                  "nodes": f["nodes"], "seq": f["seq"], "error_kind": r.error_kind,
                  "message": r.error})


@pytest.mark.parametrize("label", list(CLEAN))
def test_the_same_runs_without_injection_are_clean(label, tmp_path):
    store = tmp_path / "run.db"
    prepare(CLEAN[label], store)
    r = execute(spec(CLEAN[label], store), strict=True)  # check() after every cache call
    assert r.error is None and r.ok and r.bundles == []
    assert r.engine.admitter.budget_violations == []
    assert len(r.engine.done) + len(r.engine.rejected) == CLEAN[label]["requests"]
    if CLEAN[label].get("storage"):  # the L3 twins: prefetches ran (and hit a warm store)
        pf = r.cache.cache.storage_stats().prefetch
        assert pf.started > 0
        if CLEAN[label]["storage"] == L3_STORE:
            assert pf.prefetched_tokens > 0
    with open_store(store) as reader:
        assert reader.violations().empty
        assert reader.events("zoo.inject").empty


def test_inject_a_prefetch_fault_without_storage_is_refused_before_the_run(tmp_path):
    with pytest.raises(ValueError, match="--inject prefetch_pool_pending needs --storage"):
        execute(spec(ZOO["load_back_anchor"][0], tmp_path / "run.db"),
                inject="prefetch_pool_pending")
    assert not (tmp_path / "run.db").exists()


def test_inject_an_unknown_name_is_one_line_exit_2(capsys):
    assert main(["run", "--inject", "no_such_bug", "--no-store", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("radixscope run: error: unknown fault 'no_such_bug'; the zoo has: ")
    for name in zoo.names():
        assert name in err


def test_inject_from_the_command_line(tmp_path, capsys):
    store = tmp_path / "run.db"
    rc = main(["run", "--inject", "transfer_mutated", "--store", str(store), "--no-progress",
               "--requests", "4", "--device-tokens", "1024", "--host-tokens", "2048"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "invariant problem" in err and "full.host.slot_shared" in err
    assert list((tmp_path / "bundles").glob("bundle-*.db"))


def test_a_violation_hook_that_returns_leaves_every_budget_violation_recorded(tmp_path):
    """Outside a strict run the admitter records each budget violation in the store; a hook on
    ``on_violation`` that returns (rather than stopping the run) does not take that away."""
    settings, _rule, _op = ZOO["admission_swa_load_back"]
    store = tmp_path / "run.db"
    seen: list = []

    def install(engine) -> None:  # the fault and a returning hook, before the first admission
        if not seen and engine.admitter.on_violation is None:
            zoo.inject(engine.cache.cache, "admission_swa_load_back")
            engine.admitter.on_violation = lambda v, e: seen.append(v)
            seen.append(None)

    r = execute(spec(settings, store), fault=install)
    hooked = [v for v in seen if v is not None]
    assert hooked and r.engine.admitter.budget_violations == hooked
    with open_store(store) as reader:
        budget = reader.violations().query("kind == 'budget'")
    assert len(budget) == len(hooked)
    assert [d["req_id"] for d in budget["details"]] == [v.req_id for v in hooked]


def test_the_store_post_mortem_lists_a_repeat_of_the_violation_it_follows(tmp_path):
    """The post-mortem on a store names the violation it follows once, above, and lists every
    other row, a repeat of the same message at the same seq included."""
    import shutil
    import sqlite3

    settings, rule, _op = ZOO["lock_evicted_segment"]
    store = tmp_path / "run.db"
    r = execute(spec(settings, store), inject="lock_evicted_segment")
    assert r.error is not None
    twice = tmp_path / "twice.db"
    shutil.copy(store, twice)
    with sqlite3.connect(twice) as con:  # the same report recorded a second time
        con.execute("INSERT INTO violations (ts_ns, seq, kind, message, details) SELECT ts_ns, "
                    "seq, kind, message, details FROM violations ORDER BY id DESC LIMIT 1")
    con.close()
    for path, repeats in ((store, 0), (twice, 1)):
        with load(path) as rec:
            lines = failure_summary(rec).splitlines()
        assert f"RULE: {rule}" in lines
        assert sum(line.startswith("VIOLATION at seq ") for line in lines) == repeats, lines
