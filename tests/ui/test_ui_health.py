"""ui.shaping.health: violations tied to their op, violation lines, findings, telemetry words."""

from __future__ import annotations

import dataclasses

import pandas as pd

from radixscope.ui.shaping.health import (
    causing_op,
    findings_table,
    injected_fault,
    injection_words,
    telemetry_words,
    violation_lines,
    violations_with_ops,
)
from tests.kits.ui_snapshots import small_snapshot

MSG = ("2 invariant violation(s):\n"
       "  [full.device.evictable_ledger] node=None: ledger 166, recount 161\n"
       "  [lock.dead_pin] node=12: receipt 3 pins a deleted node")


def _ops() -> pd.DataFrame:
    return pd.DataFrame({"op_id": [1, 2, 3, 4], "op": ["match", "insert", "lock", "match"],
                         "req_id": ["a", "a", "a", "b"], "seq": [0, 6, 7, 7],
                         "mutations": [0, 6, 1, 0]})


def test_causing_op():
    ops = _ops()
    assert causing_op(ops, 3)["op_id"] == 2  # inside insert's seqs 1..6
    assert causing_op(ops, 7)["op_id"] == 3  # lock made seq 7; the match after made nothing
    assert causing_op(ops, 0)["op_id"] == 1  # no op made seq 0: the last one ending there
    assert causing_op(ops, None) is None
    assert causing_op(ops.iloc[:0], 3) is None


def test_violations_with_ops():
    v = pd.DataFrame({"id": [1, 2, 3], "ts_ns": [5, 6, 7], "seq": [6, None, 7],
                      "kind": ["invariant", "oom", "invariant"],
                      "message": [MSG, "pool out of memory", "step 3: ..."],
                      "details": [{}, {}, {"op_id": 1, "invariant": "x"}]})
    t = violations_with_ops(v, _ops())
    assert t[["id", "seq", "kind", "headline", "op_id", "op", "req_id"]].values.tolist() == [
        [1, 6, "invariant", "2 invariant violation(s)", 2, "insert", "a"],
        [2, None, "oom", "pool out of memory", None, None, None],
        [3, 7, "invariant", "step 3: ...", 1, "match", "a"]]  # the op the engine located


def test_violations_name_the_rule_and_nodes():
    v = pd.DataFrame({"id": [1, 2, 3], "ts_ns": [5, 6, 7], "seq": [6, 7, 7],
                      "kind": ["invariant", "leak", "budget"],
                      "message": [MSG, "step 9: request r ended but still owns ...", "x"],
                      "details": [{}, {"op_id": 3, "rule": "lock.released_at_request_end",
                                       "nodes": [7, 7, 9]},
                                  {"op_id": 4, "rule": "admission.guarantee", "node": 5}]})
    t = violations_with_ops(v, _ops())
    assert t[["rule", "nodes", "op_id"]].values.tolist() == [
        ["full.device.evictable_ledger", "12", 2],  # from the message's lines
        ["lock.released_at_request_end", "7, 9", 3],
        ["admission.guarantee", "5", 4]]


def test_injected_fault_banner():
    events = pd.DataFrame({"id": [1, 2], "kind": ["bundle", "zoo.inject"],
                           "attrs": [{"path": "b.db"}, {
                               "name": "leaked_lock", "class": 9, "title": "a lock never "
                               "released", "shipped": "field", "caught_by": "engine guard"}]})
    fault = injected_fault(events)
    assert fault["name"] == "leaked_lock"
    assert injected_fault(events.iloc[:1]) is None
    assert injected_fault(pd.DataFrame()) is None
    v = pd.DataFrame({"id": [1], "ts_ns": [5], "seq": [7], "kind": ["leak"], "message": ["m"],
                      "details": [{"op_id": 3, "rule": "lock.released_at_request_end",
                                   "nodes": [7]}]})
    text = injection_words(fault, violations_with_ops(v, _ops()))
    assert text == ("Injected fault (bug zoo) class 9 `leaked_lock`: a lock never released. "
                    "Shipped in: field. Caught by: engine guard. Stopped at op 3 (`lock`, "
                    "request a), seq 7: rule `lock.released_at_request_end`, nodes 7.")


def test_violation_lines():
    t = violation_lines(MSG)
    assert t.values.tolist() == [["full.device.evictable_ledger", -1, "ledger 166, recount 161"],
                                 ["lock.dead_pin", 12, "receipt 3 pins a deleted node"]]
    assert violation_lines("no structure here").empty


def test_findings_table():
    s = small_snapshot()
    assert findings_table(s)["severity"].tolist() == ["info"]  # node 2's SWA tombstone, FULL kept
    pools = (dataclasses.replace(s.pools[0], available=12),) + s.pools[1:]
    t = findings_table(dataclasses.replace(s, pools=pools))
    assert t.values.tolist()[:1] == [
        ["error", "full/device", "free 12 + evictable 10 + protected 12 = 34 tokens exceeds the "
                                 "capacity 32 by 2: slots are counted twice"]]
    assert t["severity"].tolist() == ["error", "info"]
    # a watched engine's store has no pool sizes: no capacity is checked (the doctor's rule)
    unknown = findings_table(dataclasses.replace(s, pools=pools), pools_known=False)
    assert "error" not in unknown["severity"].tolist()


def test_telemetry_words():
    ok = {"stats": {"dropped": {"op": 0, "mutation": 0}, "failures": {}, "notes": {}},
          "gaps": []}
    assert telemetry_words(ok) == ["telemetry healthy: nothing dropped, no failures, no "
                                   "journal gaps"]
    bad = {"stats": {"dropped": {"op": 2, "mutation": 9}, "failures": {"sink.ops": 1}},
           "gaps": [[40, 52]]}
    assert telemetry_words(bad) == [
        "dropped records: 9 mutation, 2 op (the recorder's queue overflowed)",
        "telemetry failures: sink.ops x1",
        "journal gap after seq 40 (next seq 52): states after seq 40 cannot be rebuilt exactly"]
    assert telemetry_words({}) == ["no telemetry stats yet: the writer has not flushed (a run "
                                   "still going?)"]
    assert telemetry_words({**ok, "cache": {"kernels": "native"}}) == telemetry_words(ok)
    slow = telemetry_words({**ok, "cache": {"kernels": "python"}})
    assert len(slow) == 2 and slow[1].startswith("the cache ran on its Python kernels")
    assert telemetry_words({**ok, "cache": {"ledger": "native"}}) == telemetry_words(ok)
    slow = telemetry_words({**ok, "cache": {"kernels": "python", "ledger": "python"}})
    assert len(slow) == 3 and slow[2].startswith("the cache ran on its Python ledger")
    assert telemetry_words({**ok, "cache": {"leaf_heap": "native"}}) == telemetry_words(ok)
    slow = telemetry_words({**ok, "cache": {"leaf_heap": "python"}})
    assert len(slow) == 2 and slow[1].startswith("the cache ran on its Python leaf heap")
    assert telemetry_words({**ok, "settings": {"encoder": "native"}}) == telemetry_words(ok)
    slow = telemetry_words({**ok, "settings": {"encoder": "python"}})
    assert len(slow) == 2 and slow[1].startswith("the recorder ran on its Python encoder")


def test_findings_table_names_a_stuck_prefetch_from_the_store_events(tmp_path):
    """Observer events in a real store: a prefetch started and never ended is a warning once
    past its budget (``now`` = the last event's time at the snapshot's seq)."""
    from radixscope import telemetry
    from radixscope.cache.storage import prefetch_events as pe

    tel = telemetry.setup(store=tmp_path / "s.db", mode="inline", capture_host_spans=False)
    obs = tel.prefetch_observer
    obs.event((pe.PREFETCH_START, "stuck", 1_000_000_000, {pe.A_TOKENS: 1024,
                                                           pe.A_REASON: "started"}))
    obs.event((pe.PREFETCH_START, "done", 1_000_000_000, {pe.A_TOKENS: 64,
                                                          pe.A_REASON: "started"}))
    obs.event((pe.PREFETCH_END, "done", 1_100_000_000, {pe.A_TOKENS: 64,
                                                        pe.A_REASON: "complete"}))
    # 1024 tokens: budget 1.25 s; the last event is 2.5 s after the start
    obs.event((pe.STORAGE_GET, "other", 3_500_000_000, {pe.A_PAGES: 1, pe.A_SECONDS: 0.001}))
    tel.close()
    with telemetry.open_store(tmp_path / "s.db") as r:
        events = r.events()
    t = findings_table(small_snapshot(), events)
    row = t[t["subject"] == "prefetch stuck"].iloc[0]
    assert row["severity"] == "warning"
    assert row["message"].startswith("stuck prefetch: started 2.5 s ago for 1024 tokens")
    assert "prefetch done" not in set(t["subject"])
    # with only the two starts the store's "now" is the start: nothing is stuck yet
    early = findings_table(small_snapshot(), events.iloc[:2])
    assert "prefetch stuck" not in set(early["subject"]) and len(early) == len(t) - 1
