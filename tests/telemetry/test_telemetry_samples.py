"""The store's pool samples (``metrics``) when the writer is behind the cache.

A writer that falls behind gets the attach and a long stretch of ops in one batch. The attach
state's sample must still be stamped in cache time, at the first op's start (not when the writer
got to it, which put an empty pool after the run's last op), and the batch must still yield a
sample per ``sample_every_ms`` of cache time, each holding the pools at its own op. Here the
drain period is longer than the test, so everything reaches the fan-out in one batch at
``close``, as it does a writer that fell behind.
"""

from __future__ import annotations

import time

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.telemetry.sinks import base
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config

EVERY_MS = 15.0
EVERY_NS = int(EVERY_MS * 1e6)
POOL_FIELDS = ("capacity", "available", "evictable", "protected", "in_flight", "held")


class Probe:
    """A registered sink that remembers, per ``ops`` call, what the fan-out handed it and
    where the replica stood."""

    calls: list[tuple[list[tuple[int, int]], list[int], int]] = []

    def __init__(self, health) -> None:
        self.journal = None
        Probe.calls = []

    def attach(self, info, snapshot, replica) -> None:
        self.journal = replica

    def ops(self, ops, mutations) -> None:
        Probe.calls.append(([(op.seq_first, op.seq_last) for op in ops],
                            [m[0] for m in mutations], self.journal.seq))

    def event(self, ts_ns, seq, kind, attrs) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _run_behind(tmp_path, monkeypatch, components) -> str:
    """40 requests over ~0.2 s of cache time, all handed to the writer in one batch."""
    monkeypatch.setitem(base.REGISTRY, "probe", f"{__name__}:Probe")
    path = str(tmp_path / "behind.db")
    tel = telemetry.setup(store=path, mode="inline", capture_host_spans=False, metrics=False,
                          drain_interval_s=600.0, sample_every_ms=EVERY_MS,
                          sinks={"probe": {}})
    c = HiRadixCache(make_config(components, device_tokens=24, host_tokens=48),
                     recorder=tel.recorder)
    d = Driver(c)
    for i in range(40):
        time.sleep(0.004)
        d.insert([1, 2, 3, 4, 5, 6][: 2 + i % 5] + [100 + i, 7, 8])
        if i % 3 == 2:
            c.poll()
        if i % 4 == 3:
            c.evict(6)
    tel.close()
    return path


def _expected(ops) -> list[tuple[int, int]]:
    """(seq, ts_ns) of the samples one batch of ``ops`` gets: the attach state at the first
    op's start; then at the end of the first op at least EVERY_NS after the previous sample,
    with that op's seq; the batch's last one at its end."""
    first = int(ops["start_ns"].min())
    due, at = [], first
    for end, seq in zip(ops["end_ns"], ops["seq_last"], strict=True):
        if end - at >= EVERY_NS:
            due.append((int(seq), int(end)))
            at = end
    if due:
        due[-1] = (int(ops["seq_last"].iloc[-1]), int(ops["end_ns"].iloc[-1]))
    return [(0, first), *due]


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_a_writer_behind_still_samples_every_interval_at_each_ops_own_state(
        tmp_path, monkeypatch, components):
    path = _run_behind(tmp_path, monkeypatch, components)
    with telemetry.open_store(path) as r:
        ops = r.ops().sort_values("op_id")
        m = r.metrics()
        samples = list(m[["seq", "ts_ns"]].drop_duplicates().itertuples(index=False, name=None))
        # the attach state (seq 0), stamped at the first op's start, not at the writer's time
        assert samples[0] == (0, int(ops["start_ns"].min()))
        assert samples[0][1] <= int(ops["start_ns"].iloc[0])
        # one sample per interval across the one batch, each at the end of its own op
        want = _expected(ops)
        assert len(want) >= 8  # ~0.2 s of ops: the batch spans many intervals
        assert samples[:-1] == want
        # the final flush sample: the same state, after the last op
        last = samples[-1]
        assert last[0] == want[-1][0] and last[1] >= want[-1][1]
        assert [s[0] for s in samples] == sorted(s[0] for s in samples)
        assert [s[1] for s in samples] == sorted(s[1] for s in samples)
        # each sample holds the pools as they were at its seq
        for seq, rows in m.groupby("seq"):
            snap = r.state_at(int(seq))
            for row in rows.itertuples():
                p = snap.pool(row.component, row.tier)
                assert tuple(getattr(row, f) for f in POOL_FIELDS) == tuple(
                    getattr(p, f) for f in POOL_FIELDS), (seq, row.component, row.tier)


def test_every_sink_gets_the_cut_batch_with_the_replica_at_each_sub_batchs_last_op(
        tmp_path, monkeypatch):
    path = _run_behind(tmp_path, monkeypatch, ("full", "swa"))
    calls = Probe.calls
    with telemetry.open_store(path) as r:
        n_ops, last_seq = len(r.ops()), r.last_seq()
        sampled = set(r.metrics()["seq"])
    assert len(calls) >= 7  # one batch, cut before each sample but the batch's last
    assert sum(len(ranges) for ranges, _, _ in calls) == n_ops
    seen: list[int] = []
    for ranges, seqs, replica_seq in calls:
        # a sub-batch's own mutations only, and the replica has applied just those
        assert seqs == list(range(ranges[0][0], ranges[-1][1] + 1))
        assert replica_seq == ranges[-1][1]
        seen += seqs
    assert seen == list(range(1, last_seq + 1))
    # every cut is where a sample was taken
    assert {ranges[-1][1] for ranges, _, _ in calls} <= sampled


class BadCutter(Probe):
    """A registered sink whose ``cuts`` returns what no sink should: a float, negatives,
    indices past the batch, a string, duplicates."""

    def cuts(self, ops) -> list:
        return [1.0, -1, 10**9, "3", 0, 0]


def test_a_sinks_bad_cuts_are_ignored_and_the_batch_still_reaches_every_sink_once(
        tmp_path, monkeypatch):
    """Whatever a sink's ``cuts`` returns, the fan-out keeps in-range int indices, once each:
    every op reaches every sink exactly once, in no empty sub-batch, and nothing fails."""
    monkeypatch.setitem(base.REGISTRY, "cutter", f"{__name__}:BadCutter")
    path = str(tmp_path / "cut.db")
    tel = telemetry.setup(store=path, mode="inline", capture_host_spans=False, metrics=False,
                          drain_interval_s=600.0, sinks={"cutter": {}})
    c = HiRadixCache(make_config(("full",), device_tokens=24, host_tokens=48),
                     recorder=tel.recorder)
    d = Driver(c)
    for i in range(6):
        d.insert([1, 2, 100 + i, 7])
    stats = tel.close()
    assert stats["failures"] == {}
    calls = Probe.calls
    assert calls and all(ranges for ranges, _, _ in calls)
    with telemetry.open_store(path) as r:
        assert sum(len(ranges) for ranges, _, _ in calls) == len(r.ops())
        assert [s for _, seqs, _ in calls for s in seqs] == list(range(1, r.last_seq() + 1))
    assert [len(ranges) for ranges, _, _ in calls][0] == 1  # the cut after op 0 was kept


def test_the_attach_sample_waits_for_an_op_and_without_one_is_written_at_flush(tmp_path):
    path = str(tmp_path / "idle.db")
    tel = telemetry.setup(store=path, mode="inline", capture_host_spans=False, metrics=False,
                          drain_interval_s=600.0, sample_every_ms=EVERY_MS)
    HiRadixCache(make_config(("full", "mamba")), recorder=tel.recorder)
    before = time.time_ns()
    tel.close()
    with telemetry.open_store(path) as r:
        m = r.metrics()
    # one sample per pool, of the attach state, once
    assert m["seq"].tolist() == [0] * 4
    assert sorted(zip(m["component"], m["tier"], strict=True)) == [
        ("full", "device"), ("full", "host"), ("mamba", "device"), ("mamba", "host")]
    assert m["ts_ns"].nunique() == 1 and m["ts_ns"].iloc[0] >= before
    assert (m["available"] == m["capacity"]).all()
