"""ui.shaping.ops: op table, filters, the ops touching a node, durations, spans, mutations."""

from __future__ import annotations

import pandas as pd
import pytest

from radixscope.ui.shaping.ops import (
    duration_figure,
    duration_stats,
    filter_ops,
    mutation_table,
    ops_table,
    ops_touching,
    span_table,
)

T0 = 1_000_000_000


@pytest.fixture()
def ops() -> pd.DataFrame:
    """Rows shaped like ``StoreReader.ops()``."""
    rows = [
        # op_id, op, start, end, req, seq_first, seq_last, attrs, error
        (1, "match", T0, T0 + 40_000, "r1", 1, 0, {"node": 0, "key_tokens": 8}, None),
        (2, "insert", T0 + 100_000, T0 + 400_000, "r1", 1, 5,
         {"node": 3, "prefix_len": 0, "new_tokens": 8}, None),
        (3, "lock", T0 + 500_000, T0 + 520_000, "r2", 6, 6, {"node": 3, "receipt": 1}, None),
        (4, "alloc", T0 + 600_000, T0 + 610_000, "r2", 7, 6, {"component": "full"},
         "CacheOutOfMemory: full/device pool out of memory: requested 99"),
        (5, "match", T0 + 2_000_000, T0 + 2_100_000, "r2", 7, 7, {"node": 3}, None),
    ]
    return pd.DataFrame(
        [(i, op, s, e, r, sf, sl, "t", "s", None, a, err)
         for i, op, s, e, r, sf, sl, a, err in rows],
        columns=["op_id", "op", "start_ns", "end_ns", "req_id", "seq_first", "seq_last",
                 "trace_id", "span_id", "parent_span_id", "attrs", "error"])


def test_ops_table(ops):
    t = ops_table(ops)
    assert t["node"].tolist() == [0, 3, 3, -1, 3]
    assert t["t_ms"].tolist() == [0.0, 0.1, 0.5, 0.6, 2.0]
    assert t["duration_us"].tolist() == [40.0, 300.0, 20.0, 10.0, 100.0]
    assert t["seq"].tolist() == [0, 5, 6, 6, 7]
    assert t["mutations"].tolist() == [0, 5, 1, 0, 1]
    assert t.loc[1, "details"] == "prefix_len=0, new_tokens=8"
    assert t.loc[3, "details"] == "component=full"
    assert list(ops_table(ops.iloc[:0]).columns) == ["op_id", "op", "req_id", "node", "t_ms",
                                                      "duration_us", "seq", "mutations", "error",
                                                      "details", "trace_id", "span_id"]


def test_filters(ops):
    t = ops_table(ops)
    assert filter_ops(t, ["match"])["op_id"].tolist() == [1, 5]
    assert filter_ops(t, req_id="r2")["op_id"].tolist() == [3, 4, 5]
    assert filter_ops(t, node=3)["op_id"].tolist() == [2, 3, 5]
    assert filter_ops(t, node=7, touching={1, 4})["op_id"].tolist() == [1, 4]
    assert filter_ops(t, t_ms=(0.1, 0.6))["op_id"].tolist() == [2, 3, 4]
    assert filter_ops(t, errors_only=True)["op_id"].tolist() == [4]
    assert filter_ops(t, ["match"], "r2", 3)["op_id"].tolist() == [5]


def test_ops_touching_a_node():
    m = pd.DataFrame(
        [(1, 2, "node.create", 3, None, None, [0, None, [1, 2]]),
         (2, 2, "comp.state", 3, "full", None, [2, None, 0, 0]),
         (3, 7, "node.split", 3, None, None, [9, 1, ["full"]]),
         (4, 8, "lock.acquire", 9, None, "device", [1, "r", [["full", [9, 0]]]]),
         (5, 9, "lock.release", 5, None, "device", [1, [["full", [9]]], True]),
         (6, 10, "pool.available", None, "full", "device", 12)],
        columns=["seq", "op_id", "kind", "node", "comp", "tier", "value"])
    assert ops_touching(m, 3) == {2, 7}
    assert ops_touching(m, 9) == {7, 8, 9}
    assert ops_touching(m.iloc[:0], 3) == set()


def test_duration_stats_and_figure(ops):
    t = ops_table(ops)
    s = duration_stats(t)
    assert s["op"].tolist() == ["match", "alloc", "insert", "lock"]
    assert s["count"].tolist() == [2, 1, 1, 1]
    assert s.loc[0, "mean_us"] == 70.0 and s.loc[0, "p50_us"] == 70.0
    assert s.loc[0, "p95_us"] == pytest.approx(97.0) and s.loc[0, "max_us"] == 100.0
    assert s["errors"].tolist() == [0, 1, 0, 0]
    fig = duration_figure(t)
    assert [tr.name for tr in fig.data] == ["alloc", "insert", "lock", "match"]
    assert list(fig.data[3].y) == [40.0, 100.0]
    assert fig.layout.yaxis.type == "log"


def test_span_and_mutation_tables():
    spans = pd.DataFrame(
        [("a" * 32, "b" * 16, None, "request", "INTERNAL", T0, T0 + 5_000_000, "OK", None,
          {"req": "r1"}, [], [], None, "engine", None),
         ("a" * 32, "c" * 16, "b" * 16, "kv_cache.match", "INTERNAL", T0 + 1_000,
          T0 + 41_000, "UNSET", None, {"kv_cache.op.id": 1}, [], [], None, "radixscope", 1)],
        columns=["trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
                 "status_code", "status_message", "attributes", "events", "links", "resource",
                 "scope", "op_id"])
    t = span_table(spans)
    assert t["name"].tolist() == ["request", "kv_cache.match"]
    assert t["t_ms"].tolist() == [0.0, 0.001] and t["duration_us"].tolist() == [5000.0, 40.0]
    assert t["attributes"].tolist() == ["req=r1", "kv_cache.op.id=1"]
    m = pd.DataFrame([(4, 2, "comp.state", 3, "full", None, [2, None, 0, 0])],
                     columns=["seq", "op_id", "kind", "node", "comp", "tier", "value"])
    assert mutation_table(m).values.tolist() == [[4, "comp.state", 3, "full", None,
                                                  "[2, None, 0, 0]"]]
