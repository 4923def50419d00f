"""AppTest per page, over two real stores: one the engine wrote (``engine.run.execute``: a chat
workload on the hybrid preset, process-mode telemetry) and a scenario store
(``tests/kits/ui_store.py``: ends with a held lock, a transfer in flight, a recorded violation and
an out-of-memory op)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from radixscope import telemetry
from radixscope.ui.shaping.budgets import budget_table
from radixscope.ui.shaping.tree import tree_model
from tests.kits.ui_store import make_store

APP = str(Path(__file__).resolve().parents[2] / "ui" / "app.py")


@pytest.fixture(autouse=True)
def _stores_root(tmp_path_factory, monkeypatch):
    """The app opens only stores under its root (`radixscope ui --root`): these tests' stores
    all live under pytest's base temp folder."""
    monkeypatch.setenv("RADIXSCOPE_ROOT", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    from radixscope.engine.run import RunSpec, execute

    path = tmp_path_factory.mktemp("ui-engine") / "chat.db"
    res = execute(RunSpec(workload="chat", requests=16, seed=1, preset="hybrid", store=str(path),
                          sizes={"device_tokens": 512, "host_tokens": 2048}))
    assert res.ok, res.error
    with telemetry.open_store(path) as r:
        last = r.last_seq()
        return {"path": str(path), "last_seq": last, "snapshot": r.state_at(last),
                "ops": r.ops(), "spans": r.spans(), "events": r.events("admission")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("ui") / "run.db"
    facts = make_store(path)
    with telemetry.open_store(path) as r:
        facts["n_ops"] = len(r.ops())
        facts["replayed"] = r.state_at(r.last_seq())
    facts["path"] = str(path)
    return facts


def _app(store: str, page: str | None = None, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.session_state["store_path"] = store
    at.session_state["live"] = False
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.run()
    if page is not None:
        at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _md(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown]


# ---- the engine's store -------------------------------------------------------------------
def test_engine_store_tree_page(engine_run):
    at = _app(engine_run["path"])
    last = engine_run["last_seq"]
    m = tree_model(engine_run["snapshot"])
    assert f"## Radix tree at seq {last:,}" in _md(at)
    assert at.caption[0].value.startswith(
        f"seq {last:,} · {m.n_nodes - 1:,} nodes · {m.total_tokens:,} tokens · drawing")
    data = json.loads(at.get("plotly_chart")[0].proto.spec)["data"]
    assert [t["type"] for t in data] == ["icicle"] * 3
    assert [t["name"] for t in data] == ["full", "swa", "mamba"]
    assert data[0]["values"][0] == m.total_tokens
    biggest = m.children(0)[0]
    at.session_state["tree.node"] = biggest
    at.run()
    assert not at.exception and f"### Node #{biggest}" in _md(at)


def test_engine_store_budgets_page(engine_run):
    at = _app(engine_run["path"], "budgets")
    shown = at.dataframe[0].value
    assert shown[["component", "tier", "available", "evictable", "protected"]].values.tolist() \
        == budget_table(engine_run["snapshot"])[["component", "tier", "available", "evictable",
                                                 "protected"]].values.tolist()
    adm = engine_run["events"]
    admitted = sum(bool(a.get("admitted")) for a in adm["attrs"])
    rejected = sum(bool(a.get("rejected")) for a in adm["attrs"])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Decisions"] == f"{len(adm):,}" and metrics["Admitted"] == f"{admitted:,}"
    assert metrics["Refused"] == f"{len(adm) - admitted - rejected:,}"
    assert metrics["Rejected"] == f"{rejected:,}"


def test_engine_store_operations_page(engine_run):
    at = _app(engine_run["path"], "operations")
    n = len(engine_run["ops"])
    assert f"## Operations ({n:,} ops, seq {engine_run['last_seq']:,})" in _md(at)
    spans = at.dataframe[-1].value  # the "All spans" tab: cache ops and the engine's requests
    assert len(spans) == len(engine_run["spans"])
    assert spans["name"].value_counts().to_dict() == \
        engine_run["spans"]["name"].value_counts().to_dict()
    at.multiselect(key="ops.op").set_value(["insert"]).run()
    n_ins = int((engine_run["ops"]["op"] == "insert").sum())
    assert at.caption[0].value.startswith(f"{n_ins:,} of {n:,} ops")


def test_engine_store_time_travel_page(engine_run):
    ops = engine_run["ops"]
    seq = int(ops.loc[ops["op"] == "insert", "seq_last"].iloc[0])
    at = _app(engine_run["path"], "time_travel", seq=seq)
    assert at.slider(key="tt.seq").value == seq
    first_insert = ops[ops["op"] == "insert"].iloc[0]
    assert any(c.value.startswith(f"state left by op {first_insert['op_id']} `insert`")
               for c in at.caption)


def test_time_travel_names_an_op_of_no_request_as_such(engine_run):
    ops = engine_run["ops"]
    free = ops[ops["req_id"].isna() & (ops["seq_last"] >= ops["seq_first"])]
    assert len(free), "the run recorded no op outside a request"
    op = free.iloc[0]
    at = _app(engine_run["path"], "time_travel", seq=int(op["seq_last"]))
    caption = next(c.value for c in at.caption if c.value.startswith("state left by op "))
    assert f"op {op['op_id']} `{op['op']}` (no request, " in caption, caption
    assert "nan" not in caption


def test_engine_store_health_page(engine_run):
    at = _app(engine_run["path"], "health")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Recorded violations"] == "0" and metrics["Doctor errors now"] == "0"
    assert at.success[0].value == "No invariant violation was recorded in this store."
    assert "- telemetry healthy: nothing dropped, no failures, no journal gaps" in _md(at)


# ---- the scenario store -------------------------------------------------------------------
def test_the_store_replays_to_the_live_cache(run):
    assert run["replayed"] == run["snapshot"]


def test_tree_page(run):
    at = _app(run["path"])
    last = run["last_seq"]
    assert f"## Radix tree at seq {last:,}" in _md(at)
    m = tree_model(run["snapshot"])
    caption = at.caption[0].value
    assert caption.startswith(f"seq {last:,} · {m.n_nodes - 1:,} nodes · {m.total_tokens:,} "
                              "tokens · drawing")
    data = json.loads(at.get("plotly_chart")[0].proto.spec)["data"]
    assert data[0]["ids"][0] == "0" and data[0]["values"][0] == m.total_tokens
    assert "### Root" in _md(at)
    # select the node the last request still holds a lock on, as a sector click would
    anchor = run["held_lock"].anchor
    at.session_state["tree.node"] = anchor
    at.run()
    assert not at.exception
    assert f"### Node #{anchor}" in _md(at)
    tables = [d.value for d in at.dataframe]
    owners = [t for t in tables if "owner" in t.columns]
    assert owners and owners[0]["owner"].tolist() == [run["held_lock"].owner]
    comp = [t for t in tables if "tier" in t.columns and "refs" in t.columns][0]
    assert comp.loc[(comp["component"] == "full") & (comp["tier"] == "device"),
                    "refs"].item() >= 1


def test_tree_page_from_a_link(run):
    seq = run["violation_seq"]
    at = _app(run["path"], seq=seq, node=1)
    assert any(m.startswith(f"## Radix tree at seq {seq:,}") for m in _md(at))
    assert "### Node #1" in _md(at)


def test_budgets_page(run):
    at = _app(run["path"], "budgets")
    snap = run["snapshot"]
    assert f"## Budgets at seq {run['last_seq']:,}" in _md(at)
    shown = at.dataframe[0].value
    expect = budget_table(snap)
    assert shown[["component", "tier", "capacity", "available", "evictable", "protected",
                  "in_flight", "held"]].values.tolist() == expect[
        ["component", "tier", "capacity", "available", "evictable", "protected", "in_flight",
         "held"]].values.tolist()
    assert any(m.startswith("- full/device: 192 tokens = ") for m in _md(at))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Refused"] == str(len(run["refused"]))
    data = json.loads(at.get("plotly_chart")[0].proto.spec)["data"]
    assert len(data) == 30 and {t["type"] for t in data} == {"scatter"}  # 3 x 2 pools x 5
    failed = at.dataframe[-1].value
    assert failed[["op", "error_type", "count"]].values.tolist() == [
        ["alloc", "CacheOutOfMemory", 1]]


def test_operations_page(run):
    at = _app(run["path"], "operations")
    assert f"## Operations ({run['n_ops']:,} ops, seq {run['last_seq']:,})" in _md(at)
    assert at.caption[0].value.startswith(f"{run['n_ops']:,} of {run['n_ops']:,} ops")
    at.multiselect(key="ops.op").set_value(["load_back"]).run()
    assert not at.exception
    shown = at.dataframe[0].value
    assert len(shown) >= 1 and set(shown["op"]) == {"load_back"}
    assert at.caption[0].value.startswith(f"{len(shown):,} of {run['n_ops']:,} ops")


def test_operations_select_an_op_then_jump_to_its_tree(run):
    at = _app(run["path"], "operations")
    table = at.dataframe[0].value
    row = int(table.index[table["op"] == "insert"][0])
    op = table.loc[row]
    at.session_state["ops.table"] = {"selection": {"rows": [row], "columns": [], "cells": []}}
    at.run()
    assert not at.exception
    detail = [m for m in _md(at) if m.startswith(f"**Op {op['op_id']}** `insert`")]
    assert detail and detail[0].endswith(f"left the tree at seq {op['seq']:,}")
    muts = at.dataframe[1].value  # the op's own mutations
    assert len(muts) == op["mutations"] and muts["seq"].max() == op["seq"]
    at.button(key="ops.to_tree").click().run()
    assert not at.exception
    assert any(m.startswith(f"## Radix tree at seq {op['seq']:,}") for m in _md(at))
    assert f"### Node #{op['node']}" in _md(at)


def test_operations_explain_a_match(run):
    at = _app(run["path"], "operations")
    table = at.dataframe[0].value
    row = int(table.index[(table["op"] == "match") & (table["req_id"] == "req-10")][0])
    at.session_state["ops.table"] = {"selection": {"rows": [row], "columns": [], "cells": []}}
    at.run()
    at.button(key="ops.why").click().run()
    assert not at.exception
    text = at.code[0].value
    assert text.startswith(f"request req-10: match (op {table.loc[row, 'op_id']}, seq ")


def test_time_travel_page(run):
    seq = run["violation_seq"]
    at = _app(run["path"], "time_travel", seq=seq)
    assert "## Time travel" in _md(at)
    assert at.slider(key="tt.seq").value == seq
    assert any(c.value.startswith("state left by op ") for c in at.caption)
    labels = [m.label for m in at.metric]
    assert labels[-6:] == ["created", "deleted", "state changes", "rekeyed", "locks acquired",
                           "locks released"]


def test_health_page(run):
    at = _app(run["path"], "health")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Recorded violations"] == "1"
    assert metrics["Doctor errors now"] == "0"
    lines = at.dataframe[1].value
    assert lines["check"].tolist() == ["full.device.evictable_ledger",
                                       "full.device.conservation"]
    head = [m for m in _md(at) if m.startswith("**Violation 1**")]
    assert head and head[0].startswith(f"**Violation 1** at seq {run['violation_seq']} — caused "
                                       "by op ")


def test_go_to_node(run):
    at = _app(run["path"])
    at.number_input(key="tree.goto_in").set_value(run["held_lock"].anchor).run()
    assert not at.exception and f"### Node #{run['held_lock'].anchor}" in _md(at)
    at.number_input(key="tree.goto_in").set_value(9999).run()
    assert at.warning[0].value == f"node 9999 is not in the tree at seq {run['last_seq']}"


def test_no_store_and_a_bad_store(tmp_path):
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["store_path"] = ""
    at.run()
    assert not at.exception
    assert at.info[0].value.startswith("No store chosen")
    bad = tmp_path / "missing.db"
    at.session_state["store_path"] = str(bad)
    at.run()
    assert not at.exception
    assert at.error[0].value == f"no telemetry store at {str(bad)!r}"
