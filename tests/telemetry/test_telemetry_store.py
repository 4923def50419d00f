"""The embedded store: tables, the reader's DataFrames, keyframes, state_at, bad paths."""

from __future__ import annotations

import sqlite3
from array import array

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.events import OpRecord
from radixscope.telemetry.record import sink
from radixscope.telemetry.store import keyframes
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config
from tests.kits.telkit import Rig


def _drive(rig: Rig, n: int = 12) -> dict[int, object]:
    """A little workload; returns the cache snapshot after every step, keyed by seq. Flushes
    after each step, so keyframes (every K mutations, at batch ends) fall in between."""
    c, d = rig.cache, Driver(rig.cache)
    snaps = {c.snapshot().seq: c.snapshot()}
    for i in range(n):
        d.insert([1, 2, 3, 4, 5, 6][: 2 + i % 5] + [100 + i, 7, 8])
        snaps[c.snapshot().seq] = c.snapshot()
        rig.tel.flush()
        if i % 3 == 2:
            c.poll()
            snaps[c.snapshot().seq] = c.snapshot()
        if i % 4 == 3:
            c.evict(6)
            snaps[c.snapshot().seq] = c.snapshot()
    return snaps


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_state_at_every_recorded_seq_equals_the_cache_snapshot(tmp_path, components):
    rig = Rig(tmp_path, components, keyframe_every=7, device_tokens=24, host_tokens=48)
    snaps = _drive(rig)
    rig.close()
    with telemetry.open_store(rig.store_path) as r:
        kf = r.keyframes()
        assert len(kf) >= 3 and kf["seq"].iloc[0] == 0
        assert r.last_seq() == max(snaps)
        for seq, snap in snaps.items():
            assert r.state_at(seq) == snap, f"state_at({seq}) differs"
        for seq in kf["seq"]:  # keyframes are exact snapshots too
            if seq in snaps:
                assert r.keyframe(int(seq)) == snaps[seq]
        # the whole journal from the first keyframe replays to the final state
        from radixscope.cache.snapshot import replay
        assert replay(r.keyframe(0), r.journal()) == snaps[max(snaps)]


def test_tables_and_dataframes(tmp_path):
    rig = Rig(tmp_path, device_tokens=24, host_tokens=48)
    _drive(rig, 4)
    rig.tel.record_admission("r1", False, need_full=12, available_full=4)
    rig.tel.record_violation("full/device: free + evictable != capacity", seq=3,
                             details={"node": 5, "missing": 2})
    rig.tel.record_event("bundle", {"path": "x.json"})
    rig.close()
    with telemetry.open_store(rig.store_path) as r:
        ops = r.ops()
        assert list(ops.columns) == ["op_id", "op", "start_ns", "end_ns", "req_id", "seq_first",
                                     "seq_last", "trace_id", "span_id", "parent_span_id",
                                     "attrs", "error"]
        assert list(ops["op_id"]) == list(range(1, len(ops) + 1))
        assert ops["attrs"].iloc[0]["key_tokens"] == 5
        muts = r.mutations()
        assert list(muts["seq"]) == list(range(1, r.last_seq() + 1))
        assert set(muts["op_id"]) <= set(ops["op_id"])
        assert str(muts["node"].dtype) == "Int64"
        first = muts[muts["kind"] == "node.create"].iloc[0]
        assert first["value"] == [0, None, [1, 2, 100, 7, 8]]
        assert r.mutations(3, 5)["seq"].tolist() == [3, 4, 5]
        ev = r.events()
        assert list(ev["kind"]) == ["admission", "bundle"]
        assert ev["attrs"].iloc[0] == {"req_id": "r1", "admitted": False, "need_full": 12,
                                       "available_full": 4}
        assert ev["seq"].iloc[0] == r.last_seq()
        v = r.violations()
        assert list(v["message"]) == ["full/device: free + evictable != capacity"]
        assert v["details"].iloc[0] == {"node": 5, "missing": 2} and v["seq"].iloc[0] == 3
        info = r.info()
        assert info["cache"]["components"] == ["full"]
        assert info["cache"]["pools"] == {"full/device": 24, "full/host": 48}
        assert info["settings"]["mode"] == "inline"
        assert info["settings"]["encoder"] == sink.ENCODER
        assert info["stats"]["dropped"] == {"op": 0, "mutation": 0, "span": 0, "event": 0}
        assert r.stats() == info["stats"]


def test_journal_chunks_read_by_range_and_through_the_sql_view(tmp_path):
    """Mutations are stored a chunk per writer batch; reads by range cut chunks at any seq, and
    the ``mutations`` view gives SQL users one row per mutation with ``value`` as JSON text."""
    import json
    import random
    rig = Rig(tmp_path, device_tokens=24, host_tokens=48)
    _drive(rig, 8)  # a flush per step: several chunks
    rig.close()
    with telemetry.open_store(rig.store_path) as r:
        chunks = r._con.execute("SELECT seq_first, seq_last FROM journal ORDER BY seq_first")
        bounds = chunks.fetchall()
        assert len(bounds) >= 4
        assert all(a[1] < b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # disjoint, in order
        full = r.mutations()
        last = r.last_seq()
        assert last == bounds[-1][1] and list(full["seq"]) == list(range(1, last + 1))
        rng = random.Random(0)
        edges = [b for pair in bounds for b in pair]
        for _ in range(40):
            lo = rng.choice([None, *edges, rng.randint(0, last + 2)])
            hi = rng.choice([None, *edges, rng.randint(0, last + 2)])
            want = full[((full["seq"] >= lo) if lo is not None else True)
                        & ((full["seq"] <= hi) if hi is not None else True)]
            got = r.mutations(lo, hi)
            assert got["seq"].tolist() == want["seq"].tolist(), (lo, hi)
            assert got["value"].tolist() == want["value"].tolist()
            assert [m[0] for m in r.journal(lo, hi)] == want["seq"].tolist()
        view = r._con.execute("SELECT * FROM mutations ORDER BY seq").fetchall()
        assert [row[:6] for row in view] == [tuple(m[:6]) for m in r.journal()]
        # the view shows values as stored: a node.create names its token count (schema 5)
        stored = [json.loads(row[6]) for row in view]
        read = full["value"].tolist()
        creates = [i for i, row in enumerate(view) if row[2] == ev.NODE_CREATE]
        assert creates
        for i in creates:
            assert stored[i][:2] == read[i][:2] and stored[i][2] == len(read[i][2]) > 0
        assert [v for i, v in enumerate(stored) if i not in creates] == \
            [v for i, v in enumerate(read) if i not in creates]


def test_each_token_is_stored_once_and_a_schema_4_store_still_reads(tmp_path):
    """A created node's tokens go to ``node_tokens`` only; its journal entry names their count
    (schema 5). A schema 4 store (tokens inline in the journal, as before) reads the same."""
    import json
    rig = Rig(tmp_path, keyframe_every=7, device_tokens=24, host_tokens=48)
    snaps = _drive(rig)
    rig.close()
    with telemetry.open_store(rig.store_path) as r:
        journal, frame = r.journal(), r.mutations()
        states = {seq: r.state_at(seq) for seq in snaps}
    assert states == snaps
    con = sqlite3.connect(rig.store_path)
    chunks = con.execute("SELECT seq_first, data FROM journal").fetchall()
    blobs = dict(con.execute("SELECT node, tokens FROM node_tokens"))
    creates = 0
    for seq_first, data in chunks:  # rewrite the store as schema 4 wrote it
        chunk = json.loads(data)
        for m in chunk:
            if m[2] == ev.NODE_CREATE:
                creates += 1
                tokens = keyframes.unpack_tokens(blobs[m[3]]).tolist()
                assert m[6][2] == len(tokens)  # a count, not the tokens
                m[6][2] = tokens
        con.execute("UPDATE journal SET data = ? WHERE seq_first = ?",
                    (json.dumps(chunk), seq_first))
    assert creates >= 5
    con.execute("UPDATE info SET value = ? WHERE key = 'schema'",
                (json.dumps({"name": "radixscope.telemetry", "version": 4}),))
    con.commit()
    con.close()
    with telemetry.open_store(rig.store_path) as r:
        assert r.journal() == journal
        assert r.mutations().equals(frame)
        assert {seq: r.state_at(seq) for seq in snaps} == snaps


def test_metric_samples_match_the_replayed_pools(tmp_path):
    rig = Rig(tmp_path, ("full", "swa"), sample_every_ms=0, device_tokens=24, host_tokens=48)
    c, d = rig.cache, Driver(rig.cache)
    for i in range(8):
        d.insert([9, 8, 7, i, i + 1, 3])
        rig.tel.flush()
        if i % 2:
            c.poll()
            rig.tel.flush()
    rig.close()
    with telemetry.open_store(rig.store_path) as r:
        m = r.metrics()
        assert set(zip(m["component"], m["tier"], strict=True)) == {
            ("full", "device"), ("full", "host"), ("swa", "device"), ("swa", "host")}
        for seq, rows in m.groupby("seq"):
            snap = r.state_at(int(seq))
            for row in rows.itertuples():
                p = snap.pool(row.component, row.tier)
                assert (row.capacity, row.available, row.evictable, row.protected,
                        row.in_flight, row.held) == (p.capacity, p.available, p.evictable,
                                                     p.protected, p.in_flight, p.held)


def test_journal_keyframe_dict_is_the_snapshot_dict(tmp_path):
    rig = Rig(tmp_path, ("full", "swa", "mamba"), device_tokens=24, host_tokens=48)
    _drive(rig, 9)
    rig.tel.flush()
    j = rig.tel.pipeline.transport.sink.journal
    assert j.snapshot().to_dict() == rig.cache.snapshot().to_dict()
    # a keyframe names each node's tokens by reference into node_tokens; resolved, it is exact
    kf = j.keyframe_dict()
    assert kf["token_refs"] == 1
    con = sqlite3.connect(rig.store_path)
    try:
        assert keyframes.load(con, keyframes.encode(kf)) == rig.cache.snapshot()
    finally:
        con.close()
    assert j.pools() == [(p.component, p.tier, p.capacity, p.available, p.evictable,
                          p.protected, p.in_flight) for p in rig.cache.snapshot().pools]
    rig.close()


def test_the_journal_replica_keeps_created_tokens_as_the_compact_array_they_came_in(tmp_path):
    """The writer's replica holds every live node's tokens. As the ``array('Q')`` a recorded
    ``node.create`` carries (and its slices, after a split) that is 8 bytes a token; as a tuple
    it was 8 plus a 32-byte int object per token: 1.2 GB of writer at 100 k nodes, against
    0.54 GB (issue 17). Snapshots still give tuples, equal to the cache's."""
    rig = Rig(tmp_path, ("full",), device_tokens=64, host_tokens=96)
    c, d = rig.cache, Driver(rig.cache)
    d.insert([70_000 + i for i in range(12)])
    d.insert([70_000 + i for i in range(5)] + [90_001, 90_002])  # splits the first node
    d.insert([80_000 + i for i in range(9)])
    rig.tel.flush()
    j = rig.tel.pipeline.transport.sink.journal
    toks = {nid: rec[2] for nid, rec in j.builder.nodes.items() if nid != 0}
    assert len(toks) == 4
    assert all(type(t) is array and t.itemsize == 8 for t in toks.values()), toks
    assert sorted(len(t) for t in toks.values()) == [2, 5, 7, 9]
    snap = j.snapshot()
    assert all(type(n.tokens) is tuple for n in snap.nodes)
    assert snap == c.snapshot()
    rig.close()


def test_reader_sees_a_consistent_store_while_it_is_written(tmp_path):
    rig = Rig(tmp_path, device_tokens=24, host_tokens=48)
    d = Driver(rig.cache)
    d.insert([1, 2, 3])
    rig.tel.flush()
    with telemetry.open_store(rig.store_path) as r:
        before = r.last_seq()
        d.insert([1, 2, 4])
        rig.tel.flush()
        assert r.last_seq() > before  # new commits are visible to an open reader
        assert r.state_at(r.last_seq()) == rig.cache.snapshot()
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            r._con.execute("DELETE FROM ops")
    rig.close()


def test_state_at_out_of_range_and_gaps(tmp_path):
    tel = telemetry.setup(store=tmp_path / "g.db", mode="inline", metrics=False, spans=False,
                          capture_host_spans=False, overflow="drop", queue_capacity=2,
                          drain_interval_s=60.0)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    d = Driver(c)
    d.insert([1, 2, 3])  # 5 ops (match, lock, alloc, insert, unlock); 2 fit: 3 dropped
    tel.flush()
    d.insert([1, 2, 4])
    stats = tel.close()
    assert stats["dropped"]["op"] == 6
    assert stats["dropped"]["mutation"] > 0
    assert stats["notes"]["journal_gaps"] >= 1
    with telemetry.open_store(tmp_path / "g.db") as r:
        ops = r.ops()
        assert len(ops) + stats["dropped"]["op"] == 10  # every op is stored or counted
        gaps = r.info()["gaps"]
        assert gaps
        with pytest.raises(ValueError, match="gap at seq"):
            r.state_at(r.last_seq())
        with pytest.raises(ValueError, match="past the last seq"):
            r.state_at(r.last_seq() + 1)
        with pytest.raises(ValueError, match="before the first keyframe"):
            r.state_at(-1)


def test_bad_store_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="no telemetry store at .*missing.db"):
        telemetry.open_store(tmp_path / "missing.db")
    with pytest.raises(ValueError, match="is a directory"):
        telemetry.open_store(tmp_path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all, just some bytes" * 100)
    with pytest.raises(ValueError, match="junk.db.*not a radixscope telemetry store"):
        telemetry.open_store(junk)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(ValueError, match="other.db.*not a radixscope telemetry store"):
        telemetry.open_store(other)
    tel = telemetry.setup(store=tmp_path / "s.db", mode="inline", capture_host_spans=False)
    tel.close()
    with pytest.raises(FileExistsError, match="s.db"):
        telemetry.setup(store=tmp_path / "s.db", mode="inline")
    with pytest.raises(ValueError, match="is a directory"):
        telemetry.setup(store=tmp_path, mode="inline")
    with pytest.raises(ValueError, match="mode='inline'"):
        telemetry.setup(store=None, span_exporters=[object()])
    with pytest.raises(ValueError, match="mode="):
        telemetry.setup(store=None, mode="thread")
    # an empty store (no cache attached yet) reads fine and says so
    with telemetry.open_store(tmp_path / "s.db") as r:
        assert r.ops().empty and r.spans().empty
        with pytest.raises(ValueError, match="no journal yet"):
            r.last_seq()


def test_overwrite_replaces_the_store(tmp_path):
    p = tmp_path / "s.db"
    for i in range(2):
        tel = telemetry.setup(store=p, overwrite=True, mode="inline", capture_host_spans=False)
        c = HiRadixCache(make_config(), recorder=tel.recorder)
        Driver(c).insert([1, 2, 3, i])
        tel.close()
    with telemetry.open_store(p) as r:
        assert len(r.ops()) == 5


def test_a_second_cache_on_one_recorder_is_refused_and_counted(tmp_path):
    tel = telemetry.setup(store=tmp_path / "s.db", mode="inline", capture_host_spans=False)
    HiRadixCache(make_config(), recorder=tel.recorder)
    HiRadixCache(make_config(), recorder=tel.recorder)
    stats = tel.close()
    assert stats["failures"]["attach"] == 1


def test_recorder_tail_holds_recent_records(tmp_path):
    tel = telemetry.setup(store=None, mode="inline", capture_host_spans=False, metrics=False,
                          flight_ring=16)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(c).insert([1, 2, 3])
    ops, muts = tel.recorder.tail()  # some may still be pending: tail includes them
    assert [o.op for o in ops] == ["match", "lock", "alloc", "insert", "unlock"]
    assert [m.seq for m in muts] == list(range(1, c.snapshot().seq + 1))
    tel.flush()
    ops2, _ = tel.recorder.tail(n_ops=2)
    assert [o.op for o in ops2] == ["insert", "unlock"]
    assert isinstance(ops2[0], OpRecord)
    tel.close()


def test_a_forked_child_drops_and_counts_instead_of_blocking():
    import os

    tel = telemetry.setup(store=None, mode="inline", capture_host_spans=False, metrics=False)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    pid = os.fork()
    if pid == 0:  # the child has no drain thread: records are dropped and counted at once
        Driver(c).insert([1, 2, 3])
        os._exit(0 if tel.health.snapshot()["dropped"]["op"] == 5 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    Driver(c).insert([1, 2, 3])
    assert tel.close()["dropped"]["op"] == 0
