"""ui.shaping.budgets: pools over time, the pool table, admissions, failed ops."""

from __future__ import annotations

import pandas as pd
import pytest

from radixscope.ui.shaping.budgets import (
    admission_summary,
    admissions_table,
    budget_figure,
    budget_series,
    budget_table,
    failed_ops,
    replayed_pools,
)
from tests.kits.ui_snapshots import small_snapshot


@pytest.fixture()
def metrics() -> pd.DataFrame:
    rows = [  # seq, ts, comp, tier, capacity, available, evictable, protected, in_flight
        (0, 1, "full", "device", 64, 64, 0, 0, 0),
        (0, 1, "full", "host", 128, 128, 0, 0, 0),
        (10, 2, "full", "device", 64, 30, 20, 10, 4),
        (10, 3, "full", "device", 64, 28, 20, 12, 4),  # same seq: the last sample wins
        (10, 3, "full", "host", 128, 100, 28, 0, 0),
        (20, 4, "full", "device", 64, 10, 40, 14, 0),
        (20, 4, "full", "host", 128, 80, 40, 8, 8),
        (30, 5, "full", "device", 64, 10, 40, 4, 6),  # 2 of 6 in flight are request-held
    ]
    return pd.DataFrame(rows, columns=["seq", "ts_ns", "component", "tier", "capacity",
                                       "available", "evictable", "protected", "in_flight"])


def test_budget_series_stacks_to_capacity(metrics):
    s = budget_series(metrics, "full", "device")
    assert s.index.tolist() == [0, 10, 20, 30]
    assert s.to_dict("list") == {"capacity": [64] * 4, "available": [64, 28, 10, 10],
                                 "evictable": [0, 20, 40, 40], "protected": [0, 8, 14, 0],
                                 "in_flight": [0, 4, 0, 4], "held": [0, 4, 0, 10]}
    parts = s[["available", "evictable", "protected", "in_flight", "held"]].sum(axis=1)
    assert parts.tolist() == s["capacity"].tolist()
    with pytest.raises(ValueError, match=r"no metric samples for pool swa/device; have "
                                         r"\['full/device', 'full/host'\]"):
        budget_series(metrics, "swa", "device")


def test_budget_figure_grid(metrics):
    fig = budget_figure(metrics, ("full",))
    assert len(fig.data) == 10  # 2 tiers x 5 parts
    assert [t.name for t in fig.data[:5]] == ["free", "evictable (cached, unpinned)",
                                              "protected (locked / host-referenced)",
                                              "in flight (copy not acked)", "held by requests"]
    assert {t.stackgroup for t in fig.data} == {"full/device", "full/host"}
    assert sum(t.showlegend for t in fig.data) == 5
    assert list(fig.data[5].y) == [128, 100, 80]
    assert list(fig.data[3].y) == [0, 4, 0, 4]


def test_budget_table_of_a_snapshot():
    t = budget_table(small_snapshot())
    assert t.values.tolist() == [
        ["full", "device", "tokens", 32, 8, 10, 12, 0, 2, 75.0],
        ["full", "host", "tokens", 64, 45, 13, 6, 6, 0, 29.7],
        ["swa", "device", "tokens", 16, 0, 12, 4, 0, 0, 100.0],
        ["swa", "host", "tokens", 16, 13, 3, 0, 0, 0, 18.8],
        ["mamba", "device", "states", 4, 2, 1, 1, 0, 0, 50.0],
        ["mamba", "host", "states", 4, 3, 1, 0, 0, 0, 25.0],
    ]


def test_admissions_from_both_record_styles():
    ev = pd.DataFrame(
        [(1, 5, 3, "admission", {"req_id": "r1", "admitted": True, "fits": True,
                                  "reason": "admitted: full: ..."}),
         (2, 6, 9, "admission", {"req_id": "r2", "admitted": False, "reason": "refused: ...",
                                  "components": {"full": {"need": 90, "headroom": 40},
                                                 "swa": {"need": 10, "headroom": 400}}}),
         (3, 7, 11, "bundle", {"path": "x"}),
         (4, 8, 12, "admission", {"req_id": "r3", "admitted": False,
                                  "reason": "refused: swa: needs 96 tokens (load-back 64 + "
                                            "prefill 32); ...; mamba: needs 2 states ..."}),
         (5, 9, 14, "admission", {"req_id": "r4", "admitted": False, "rejected": True,
                                  "reason": "rejected: full: needs 9000 tokens ..."})],
        columns=["id", "ts_ns", "seq", "kind", "attrs"])
    t = admissions_table(ev)
    assert t[["seq", "req_id", "admitted", "verdict", "blocking"]].values.tolist() == [
        [3, "r1", True, "admitted", ""], [9, "r2", False, "refused", "full"],
        [12, "r3", False, "refused", "swa, mamba"], [14, "r4", False, "rejected", "full"]]
    assert admission_summary(t).values.tolist() == [["admitted", "", 1],
                                                    ["refused", "full", 1],
                                                    ["refused", "swa, mamba", 1],
                                                    ["rejected", "full", 1]]
    assert admissions_table(ev.iloc[:0]).empty


def test_failed_ops_grouped_by_error_type():
    t = pd.DataFrame({"op": ["alloc", "alloc", "insert", "match"], "seq": [9, 4, 6, 1],
                      "error": ["CacheOutOfMemory: full/device ... requested 99",
                                "CacheOutOfMemory: full/device ... requested 40",
                                "ValueError: slots [3] are not allocated", None]})
    assert failed_ops(t).values.tolist() == [
        ["alloc", "CacheOutOfMemory", 2, 4, "CacheOutOfMemory: full/device ... requested 40"],
        ["insert", "ValueError", 1, 6, "ValueError: slots [3] are not allocated"]]


def test_replayed_pools_match_the_live_cache():
    """A real cache recording into a flight recorder: the replayed ledgers end exactly at the
    cache's own pools; samples fall on op boundaries only."""
    from radixscope.cache import CacheConfig, HiRadixCache
    from radixscope.cache.events import FlightRecorder

    rec = FlightRecorder()
    c = HiRadixCache(CacheConfig.preset("swa", device_tokens=64, host_tokens=256), recorder=rec)
    for i in range(6):
        toks = list(range(100 * i, 100 * i + 24))
        m = c.match_prefix(toks)
        full = c.alloc(24)
        c.insert(toks, full, swa_indices=c.alloc(24, component="swa"),
                 prev_prefix_len=m.device_prefix_len)
        c.poll(wait=True)
    _, muts = rec.tail()
    df = replayed_pools(rec.initial_snapshot, muts, points=10)
    op_end = {muts[k].seq for k in range(len(muts))
              if k == len(muts) - 1 or muts[k + 1].op_id != muts[k].op_id}
    sampled = sorted(set(df["seq"]))
    assert sampled[0] == rec.initial_snapshot.seq and set(sampled[1:]) <= op_end
    assert 6 <= len(sampled) <= 12
    last = df[df["seq"] == df["seq"].max()]
    assert df["seq"].max() == c.snapshot().seq
    assert [tuple(r) for r in last[["component", "tier", "capacity", "available", "evictable",
                                    "protected", "in_flight"]].values] == [
        (p.component, p.tier, p.capacity, p.available, p.evictable, p.protected, p.in_flight)
        for p in c.snapshot().pools]
    assert budget_series(df, "full", "device")["available"].iloc[0] == 64
    with pytest.raises(ValueError, match="points=0"):
        replayed_pools(rec.initial_snapshot, muts, points=0)
