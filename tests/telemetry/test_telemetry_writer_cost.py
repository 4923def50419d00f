"""The writer's per-op cost (issue 17): the store's JSON through msgspec with the json module's
output (``telemetry.store.jsontext``), and keyframes spaced by the tree's size
(``keyframe_nodes``) so their cost per mutation is bounded."""

from __future__ import annotations

import json
import math
import os
from array import array

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache.results import TransferId
from radixscope.telemetry.options import TelemetryOptions
from radixscope.telemetry.record import encode
from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.sinks.store_sink import StoreSink
from radixscope.telemetry.store.jsontext import dumps, json_bytes
from radixscope.telemetry.store.schema import create_store, resolve_new_store
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config
from tests.kits.telkit import Rig


def _json(v) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("value", [
    {"key_tokens": 12, "node": 3, "extra_key": None, "freed": {"full": 4}, "ok": True},
    [(1, 2, "comp.state", 3, "full", None, ((4, None, None), (0, 1, 0)))],
    "tökens \"quoted\"", 2**70, -5, 1.5, [], {}])
def test_dumps_writes_what_the_json_module_writes(value):
    assert dumps(value) == _json(value) == encode.dumps(value)  # msgspec, json, json module
    assert json_bytes(value) == _json(value).encode()


def test_dumps_writes_an_int_subclass_as_its_number_and_odd_values_as_their_repr():
    assert dumps({"transfer": TransferId(7, 3)}) == '{"transfer":7}'
    assert dumps([array("Q", [1, 2])]) == encode.dumps([array("Q", [1, 2])]) == "[[1,2]]"
    assert dumps({"x": object}) == '{"x":"<class \'object\'>"}'
    assert dumps({(1, 2): 3}) == '{"(1, 2)":3}'  # the json module refused such a key


def test_dumps_writes_non_finite_floats_as_null_which_sqlite_can_read():
    assert dumps({"x": math.nan, "y": math.inf}) == '{"x":null,"y":null}'


def _keyframe_gaps(tmp_path, keyframe_nodes: float) -> tuple[list[int], int]:
    tel = telemetry.setup(store=tmp_path / f"k{keyframe_nodes}.db", mode="inline",
                          metrics=False, capture_host_spans=False, keyframe_every=1,
                          keyframe_nodes=keyframe_nodes)
    c = HiRadixCache(make_config(("full",), device_tokens=64, host_tokens=0),
                     recorder=tel.recorder)
    for key in ([1, 2], [3, 4], [5, 6], [7, 8]):
        c.insert(key, c.alloc(2))
    tel.flush()
    nodes = len(c.tree.nodes)  # 5 with the root: what the replica counts
    for _ in range(30):
        c.unlock(c.lock(1, owner="o"))  # two mutations, no new node
        tel.flush()  # one batch: the keyframe check runs once per batch
    tel.close()
    with telemetry.open_store(tmp_path / f"k{keyframe_nodes}.db") as r:
        seqs = sorted(int(s) for s in r.keyframes()["seq"])
    return [b - a for a, b in zip(seqs[1:], seqs[2:], strict=False)], nodes


def test_keyframes_come_every_keyframe_nodes_times_the_node_count(tmp_path):
    gaps, nodes = _keyframe_gaps(tmp_path, 2.0)
    assert nodes == 5
    assert gaps and set(gaps) == {10}  # 2 x 5 nodes: every fifth lock/unlock pair


def test_keyframe_nodes_zero_keeps_the_plain_mutation_cadence(tmp_path):
    gaps, _ = _keyframe_gaps(tmp_path, 0)
    assert gaps and set(gaps) == {2}  # every batch: keyframe_every=1


@pytest.mark.parametrize("bad", [-1, math.nan, True, "2"])
def test_a_bad_keyframe_nodes_is_refused_naming_it(tmp_path, bad):
    with pytest.raises(ValueError, match="keyframe_nodes"):
        TelemetryOptions(keyframe_nodes=bad)
    if isinstance(bad, (int, float)) and not isinstance(bad, bool):
        path = resolve_new_store(tmp_path / "s.db", overwrite=True)
        create_store(path, {}, overwrite=True)
        with pytest.raises(ValueError, match="keyframe_nodes"):
            StoreSink(Health(), str(path), keyframe_nodes=bad)


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_the_replica_follows_overlapping_locks_and_partial_releases_exactly(tmp_path,
                                                                             components):
    """The journal applies lock mutations itself (refs and ledgers in one pass): after every
    step its pools and its tree equal the cache's own snapshot."""
    rig = Rig(tmp_path, components, device_tokens=40, host_tokens=48)
    c, d = rig.cache, Driver(rig.cache)

    def same() -> None:
        rig.tel.flush()
        j = rig.tel.pipeline.transport.sink.journal
        snap = c.snapshot()
        assert j.snapshot() == snap
        assert j.pools() == [(p.component, p.tier, p.capacity, p.available, p.evictable,
                              p.protected, p.in_flight) for p in snap.pools]

    d.insert([1, 2, 3, 4, 5, 6], req_id="a")
    d.insert([1, 2, 3, 9], req_id="b")
    same()
    deep = c.match_prefix([1, 2, 3, 4, 5, 6]).last_device_node
    mid = c.match_prefix([1, 2, 3, 9]).last_device_node
    r1 = c.lock(deep, owner="x")
    r2 = c.lock(deep, owner="y")  # the same path pinned twice: refs 2, no ledger move
    r3 = c.lock(mid, owner="z")
    same()
    if "swa" in c.ci:
        r1 = c.release_swa(r1)  # a partial release keeps the lock live
        same()
    c.unlock(r2)
    same()
    c.evict(40)  # only what no lock pins goes
    same()
    c.unlock(r1)
    c.unlock(r3)
    same()
    c.evict(40)
    same()
    rig.close()


def test_a_waiting_host_runs_the_writer_at_its_own_priority(tmp_path):
    """The writer runs niced; while the host waits for it (flush, close) it runs at the host's
    priority where the OS allows (root here), and flush gives the niceness back after."""
    tel = telemetry.setup(store=tmp_path / "p.db", metrics=False, capture_host_spans=False)
    t = tel.pipeline.transport
    pid = t.process.pid
    host = os.getpriority(os.PRIO_PROCESS, 0)
    niced = min(host + TelemetryOptions().writer_nice, 19)
    tel.flush()  # the writer has niced itself once it answers
    assert os.getpriority(os.PRIO_PROCESS, pid) == niced
    raised = t.prioritize()
    if os.geteuid() == 0:
        assert raised
    if raised:
        assert os.getpriority(os.PRIO_PROCESS, pid) == host
        assert not t.prioritize()  # already there
        t.deprioritize()
    assert os.getpriority(os.PRIO_PROCESS, pid) == niced
    tel.flush()  # raised for the wait, restored after
    assert os.getpriority(os.PRIO_PROCESS, pid) == niced
    tel.close()


def test_the_writers_small_page_cache_commits_a_batch_larger_than_itself(tmp_path):
    """The writer's page cache is ``WRITER_CACHE_KIB`` (it appends; a larger cache only fills
    the last-level cache the cache's thread shares). A batch far larger than that cache spills
    pages to the WAL before its commit, and a reader sees all of it, exactly, once committed."""
    import sqlite3

    from radixscope.telemetry.store.schema import WRITER_CACHE_KIB
    from radixscope.telemetry.store.writer import StoreWriter
    path = resolve_new_store(tmp_path / "s.db", overwrite=True)
    create_store(path, {}, overwrite=True)
    w = StoreWriter(path)
    assert w.con.execute("PRAGMA cache_size").fetchone()[0] == -WRITER_CACHE_KIB
    blob = os.urandom(16 * WRITER_CACHE_KIB * 1024)  # 16x the cache, incompressible
    tokens = array("Q", range(100_000))
    muts = [(s, 1, "node.create", 100 + s, None, None, (1, None, tokens[s:s + 5000]))
            for s in range(1, 21)]
    w.write_journal(muts)
    w.write_keyframe(20, blob, ts_ns=1)
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > len(blob) // 2  # spilled into the WAL, not held in the cache
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert reader.execute("SELECT count(*) FROM keyframes").fetchone()[0] == 0  # not yet
        w.commit()
        assert reader.execute("SELECT snapshot FROM keyframes").fetchone()[0] == blob
    finally:
        reader.close()
        w.close()
    with telemetry.open_store(path) as r:
        got = r.journal()
    assert [m[6][2] for m in got] == [tuple(tokens[s:s + 5000]) for s in range(1, 21)]
