"""ui.shaping.diff: what changed between two snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from radixscope.cache.snapshot import ComponentState, LockSnapshot, NodeSnapshot, PoolSnapshot
from radixscope.ui.shaping.diff import diff_snapshots
from tests.kits.ui_snapshots import NONE, small_snapshot


def C(dev, host, lock, href) -> ComponentState:  # noqa: N802 - reads as a constructor
    return ComponentState.on({"device": dev, "host": host}, {"device": lock, "host": href})


def _after():
    """The small tree 8 seqs later: lock 7 released, lock 8 taken on node 5, node 4 deleted,
    node 7 created under 5, node 6 evicted from the device, node 2 re-keyed to 4 tokens."""
    s = small_snapshot()
    n = {x.node_id: x for x in s.nodes}
    n[1] = dataclasses.replace(n[1], components=(C(8, 8, 0, 0), C(8, None, 0, 0), NONE))
    n[2] = dataclasses.replace(n[2], tokens=(20, 21, 22, 23))
    n[3] = dataclasses.replace(n[3], components=(C(4, None, 0, 0), C(4, None, 0, 0),
                                                 C(1, None, 0, 0)))
    n[6] = dataclasses.replace(n[6], components=(C(None, 3, 0, 0), C(3, 3, 0, 0), NONE))
    del n[4]
    n[7] = NodeSnapshot(7, 5, None, (41, 42), 20, 0, (C(2, None, 0, 0), NONE, NONE))
    pools = tuple(dataclasses.replace(p, available=p.available - 2)
                  if (p.component, p.tier) == ("full", "device") else p for p in s.pools)
    return dataclasses.replace(
        s, seq=48, nodes=tuple(n[i] for i in sorted(n)), pools=pools,
        locks=(LockSnapshot(8, "req-b", 5, "device", (("full", (5, 2)),)),))


def test_diff_of_two_snapshots():
    d = diff_snapshots(small_snapshot(), _after())
    assert (d.seq_before, d.seq_after) == (40, 48)
    assert d.counts() == {"created": 1, "deleted": 1, "state_changes": 5, "rekeyed": 1,
                          "locks_acquired": 1, "locks_released": 1}
    assert d.created.values.tolist() == [[7, 5, 2]]
    assert d.deleted.values.tolist() == [[4, 1, 2]]
    assert d.rekeyed.values.tolist() == [[2, 6, 4, 0, 0]]
    assert d.changes.values.tolist() == [
        [1, "full", "device", "refs", 8, 8, 1, 0],
        [3, "full", "device", "refs", 4, 4, 1, 0],
        [3, "swa", "device", "refs", 4, 4, 1, 0],
        [3, "mamba", "device", "refs", 1, 1, 1, 0],
        [6, "full", "device", "removed", 3, -1, 0, 0],
    ]
    assert d.locks.values.tolist() == [[8, "req-b", 5, "acquired"], [7, "req-a", 3, "released"]]
    row = d.pools.iloc[0]
    assert (row["component"], row["tier"], row["available_before"], row["available_after"],
            row["available_delta"]) == ("full", "device", 8, 6, -2)
    assert d.pools["available_delta"].tolist() == [-2, 0, 0, 0, 0, 0]


def test_change_matrix():
    m = diff_snapshots(small_snapshot(), _after()).change_matrix()
    assert m.reset_index().values.tolist() == [["full", "device", 0, 1, 0, 2],
                                               ["mamba", "device", 0, 0, 0, 1],
                                               ["swa", "device", 0, 0, 0, 1]]
    assert list(m.columns) == ["added", "removed", "resized", "refs"]


def test_identical_snapshots_and_added_resized():
    s = small_snapshot()
    d = diff_snapshots(s, s)
    assert d.counts() == {"created": 0, "deleted": 0, "state_changes": 0, "rekeyed": 0,
                          "locks_acquired": 0, "locks_released": 0}
    assert d.change_matrix().empty
    n = list(s.nodes)
    n[4] = dataclasses.replace(n[4], components=(C(2, 2, 0, 0), C(2, None, 0, 0),
                                                 C(None, 1, 0, 0)))
    n[5] = dataclasses.replace(n[5], components=(C(1, None, 0, 0), C(1, 1, 0, 0), NONE))
    d = diff_snapshots(s, dataclasses.replace(s, nodes=tuple(n)))
    assert d.changes[["node_id", "component", "tier", "change"]].values.tolist() == [
        [4, "full", "device", "added"], [4, "swa", "device", "added"],
        [5, "swa", "host", "added"]]


def test_different_caches_refuse():
    s = small_snapshot()
    other = dataclasses.replace(s, components=("full",), pools=(
        PoolSnapshot("full", "device", 1, 1, 0, 0, 0),))
    with pytest.raises(ValueError, match="cannot diff snapshots of different caches"):
        diff_snapshots(s, other)
