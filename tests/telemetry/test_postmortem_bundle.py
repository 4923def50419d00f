"""Crash bundles on a real cache: injected faults, the round trip, and files that are not bundles."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest

from radixscope.cache import CacheOutOfMemory, HiRadixCache, InvariantViolation
from radixscope.cache.events import FlightRecorder
from radixscope.cache.ledger import LEDGER
from radixscope.cache.tiers import Tier
from radixscope.telemetry.analysis.load import load, load_bundle
from radixscope.telemetry.analysis.postmortem import (
    failure_point,
    failure_summary,
    ops_before_failure,
)
from radixscope.telemetry.capture.bundle import write_bundle
from radixscope.telemetry.capture.crash import SignalTrigger, install_crash_bundles
from radixscope.telemetry.capture.flight import KeyframedFlightRecorder
from tests.kits.cachekit import Driver, make_config

A = list(range(10))


def load_back_oom(tmp_path: Path, recorder) -> tuple[HiRadixCache, object, dict, object]:
    """Four warm-up requests, r1 caches A, an eviction demotes it to host, a request holds 12
    of the 16 device slots, and r2's load-back of A (10 tokens) cannot fit."""
    c = HiRadixCache(make_config(device_tokens=16, host_tokens=64), recorder=recorder)
    d = Driver(c)
    bundler = install_crash_bundles(c, tmp_path / "bundles")
    seen = {}
    for i in range(4):
        d.insert([100 + i] * 4 + A[:6], req_id=f"w{i}")
        c.poll(wait=True)
        seen[c.seq] = c.snapshot()
    d.insert(A, req_id="r1")
    c.poll(wait=True)
    seen[c.seq] = c.snapshot()
    c.evict(16, req_id="ev")
    seen[c.seq] = c.snapshot()
    c.alloc(12, req_id="hog")
    seen[c.seq] = c.snapshot()
    m = c.match_prefix(A, req_id="r2")
    seen[c.seq] = c.snapshot()
    with pytest.raises(CacheOutOfMemory):
        c.load_back(m, req_id="r2")
    return c, bundler, seen, m


def test_load_back_oom_writes_a_bundle_that_rebuilds_every_seq_of_its_window(tmp_path):
    rec = KeyframedFlightRecorder(capacity=8, trim_chunk=4)  # the ring wraps: a keyframe is kept
    c, bundler, seen, m = load_back_oom(tmp_path, rec)
    live = c.snapshot()
    assert len(bundler.written) == 1 and bundler.written[0].parent == tmp_path / "bundles"
    r = load_bundle(bundler.written[0])
    f = r.failure()
    assert (f["op"], f["op_id"], f["req_id"], f["node"], f["exception"], f["seq"]) == (
        "load_back", 34, "r2", m.best_match_node, "CacheOutOfMemory", 82)
    assert m.best_match_node == 5
    assert f["oom"] == {"component": "full", "tier": "device", "requested": 10, "available": 4,
                        "evictable": 0, "protected": 0}
    assert f["traceback"][-1].startswith("radixscope.cache.errors.CacheOutOfMemory: full/device pool out")
    # the room check fails before the load-back changes anything (no split, no pins); the
    # frames start at the op's own code (the C ledger that ran it has no Python frame)
    frames = [fr["function"] for fr in f["frames"]]
    assert frames == ([] if LEDGER == "native" else ["run"]) + ["_load_back", "_check_room"]
    w = r.manifest()["window"]
    assert (w["keyframe_seq"], w["first_seq"], w["last_seq"], w["replayable"], w["ops"]) == (
        52, 53, 82, True, 8)
    assert r.manifest()["replay"] == {"ok": True, "why": None, "diff": []}
    # the round trip: the failure seq, and every op boundary the window covers
    assert r.state_at(f["seq"]) == live == r.snapshot()
    covered = [s for s in seen if s >= 52]
    assert covered == [62, 78, 80, 81, 82]
    for s in covered:
        assert r.state_at(s) == seen[s]
    with pytest.raises(ValueError, match=r"this bundle rebuilds seqs 52\.\.82"):
        r.state_at(51)
    assert list(r.nodes()["state_full"]) == ["root", "host", "host", "host", "host", "host"]
    ops = ops_before_failure(r, 3)
    assert list(ops["op"]) == ["alloc", "match", "load_back"]
    assert ops["error"].iloc[-1].startswith("CacheOutOfMemory: full/device pool out of memory")
    assert failure_point(r) == (82, 82)  # the failed load-back changed nothing
    led = r.ledgers().set_index(["component", "tier"])
    assert led.loc[("full", "device"), ["available", "request_held", "evictable"]].tolist() == [
        4, 12, 0]
    # the budget timeline: one sample per pool at the window start and after every op
    met = r.metrics()
    dev = met[(met["component"] == "full") & (met["tier"] == "device")]
    assert dev["seq"].iloc[0] == 52 and dev["seq"].iloc[-1] == 82
    assert dev["held"].iloc[-1] == 12


def test_a_leaked_lock_ref_surfaces_as_an_alloc_oom_and_the_bundle_names_it(tmp_path):
    c = HiRadixCache(make_config(device_tokens=16, host_tokens=64),
                     recorder=KeyframedFlightRecorder(capacity=64))
    d = Driver(c)
    bundler = install_crash_bundles(c, tmp_path)
    d.insert(list(range(8)), req_id="r1")
    c.poll(wait=True)
    d.insert([9] * 8, req_id="r2")
    c.poll(wait=True)
    node = c.node(1)
    node.data[0].refs[Tier.DEVICE] += 1  # the fault: a pin with no lock behind it, ledgers not moved
    c.refresh_leaf(node)
    with pytest.raises(CacheOutOfMemory, match="eviction could not reach the evictable total"):
        c.alloc(16, req_id="big")
    r = load_bundle(bundler.written[0])
    f = r.failure()
    assert (f["op"], f["req_id"], f["node"]) == ("alloc", "big", 1)
    assert r.check_violations().values.tolist() == [
        ["full.lock_ref", 1, "1 but the lock table holds 0 pin(s)"],
        ["full.device.evictable_ledger", pd_na(), "ledger 8, recount 0"],
        ["full.device.protected_ledger", pd_na(), "ledger 0, recount 8"]]
    rp = r.manifest()["replay"]
    assert rp["ok"] is False
    # the journal never saw the pin: replayed and live disagree on exactly that node
    assert rp["diff"] == [["node", 1, "parent 0 len 8 [8,8,lock 0,href 0]",
                           "parent 0 len 8 [8,8,lock 1,href 0]"]]
    assert list(r.violations()["kind"]) == ["oom", "invariant", "invariant", "invariant"]
    summary = failure_summary(r)
    assert "FAILED OP: alloc (op 13, req big) at seq 30" in summary
    assert "  [full.lock_ref] node=1: 1 but the lock table holds 0 pin(s)" in summary


def pd_na():
    import pandas as pd

    return pd.NA


def test_check_violation_writes_a_bundle_and_dump_bundle_writes_on_demand(tmp_path):
    c = HiRadixCache(make_config(device_tokens=16, host_tokens=64),
                     recorder=KeyframedFlightRecorder(capacity=64))
    bundler = install_crash_bundles(c, tmp_path)
    Driver(c).insert(list(range(8)), req_id="r1")
    c.poll(wait=True)
    c.evictable[0][0] += 5  # a broken ledger
    with pytest.raises(InvariantViolation):
        c.check()
    assert len(bundler.written) == 1  # written by the hook, before the exception propagated
    expected = [
        ["full.device.evictable_ledger", None, "ledger 13, recount 8"],
        ["full.device.conservation", None, "free 8 + evictable 13 + protected 0 + held by "
         "requests 0 = 21 != capacity 16"]]
    f = load_bundle(bundler.written[0]).failure()
    assert (f["exception"], f["op"], f["trigger"]) == ("InvariantViolation", "check", "error")
    assert f["violations"] == expected
    path = c.dump_bundle(tmp_path / "check.db", note="on demand")
    assert bundler.written[-1] == path == tmp_path / "check.db"
    assert load_bundle(path).check_violations()["name"].tolist() == [v[0] for v in expected]


def test_a_plain_flight_recorder_whose_ring_wrapped_keeps_the_failure_state_only(tmp_path):
    c, bundler, _seen, _m = load_back_oom(tmp_path, FlightRecorder(capacity=8))
    live = c.snapshot()
    r = load_bundle(bundler.written[0])
    w = r.manifest()["window"]
    assert (w["ring_wrapped"], w["replayable"], w["keyframe_seq"]) == (True, False, 82)
    assert r.state_at(82) == live
    with pytest.raises(ValueError, match="KeyframedFlightRecorder"):
        r.state_at(83)


def test_n_ops_moves_the_keyframe_to_the_first_kept_op(tmp_path):
    c = HiRadixCache(make_config(device_tokens=16, host_tokens=64),
                     recorder=KeyframedFlightRecorder(capacity=256))
    d = Driver(c)
    d.insert(A, req_id="r1")
    mid = c.snapshot()
    d.insert(A[:4] + [50, 51], req_id="r2")
    r = load_bundle(write_bundle(c, tmp_path / "b.db", n_ops=5))
    assert list(r.ops()["op"]) == ["match", "lock", "alloc", "insert", "unlock"]
    w = r.manifest()["window"]
    assert w["keyframe_seq"] == mid.seq
    assert r.state_at(mid.seq) == mid and r.state_at(c.seq) == c.snapshot()


def test_keyframed_recorder_window_replays_to_the_live_cache():
    rec = KeyframedFlightRecorder(capacity=4, trim_chunk=3)
    c = HiRadixCache(make_config(device_tokens=32, host_tokens=64), recorder=rec)
    d = Driver(c)
    for i in range(6):
        d.insert([i] * 3 + A, req_id=f"r{i}")
        c.poll(wait=True)
    start, ops, muts = rec.window()
    assert len(ops) == 4 and len(muts) <= 16 and muts[0].seq == start.seq + 1
    from radixscope.cache.snapshot import replay

    assert replay(start, muts) == c.snapshot()


def test_bundles_from_a_telemetry_recorder_and_the_store_agree(tmp_path):
    from radixscope import telemetry

    tel = telemetry.setup(store=tmp_path / "run.db", mode="inline", spans=False, metrics=False,
                          capture_host_spans=False)
    c = HiRadixCache(make_config(device_tokens=16, host_tokens=64), recorder=tel.recorder)
    bundler = install_crash_bundles(c, tmp_path / "b", telemetry=tel)
    d = Driver(c)
    d.insert(A, req_id="r1")
    c.poll(wait=True)
    c.evict(10, req_id="ev")
    c.alloc(12, req_id="hog")
    m = c.match_prefix(A, req_id="r2")
    with pytest.raises(CacheOutOfMemory):
        c.load_back(m, req_id="r2")
    live = c.snapshot()
    tel.close()
    b = load_bundle(bundler.written[0])
    s = load(tmp_path / "run.db")
    assert not s.is_bundle and s.failure() is None
    assert b.state_at(live.seq) == s.state_at(live.seq) == live
    assert b.ops()["op_id"].tolist() == s.ops()["op_id"].tolist()
    assert s.events(kind="bundle")["attrs"].iloc[0]["path"] == str(bundler.written[0])
    assert s.violations()["kind"].tolist() == ["oom"]
    with pytest.raises(ValueError, match="is a telemetry store, not a crash bundle"):
        load_bundle(tmp_path / "run.db")


def test_signal_trigger_writes_on_the_callers_thread(tmp_path):
    c = HiRadixCache(make_config(), recorder=KeyframedFlightRecorder(capacity=16))
    bundler = install_crash_bundles(c, tmp_path)
    trig = SignalTrigger(bundler, signal.SIGUSR1)
    try:
        assert trig.service() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        path = trig.service()
        assert path is not None and trig.service() is None
        f = load_bundle(path).failure()
        assert (f["trigger"], f["note"], f["exception"]) == ("on_demand",
                                                             "on demand: signal SIGUSR1", None)
    finally:
        trig.close()


def test_hook_limits_chaining_uninstall_and_bad_input(tmp_path):
    c = HiRadixCache(make_config(device_tokens=16, host_tokens=0),
                     recorder=KeyframedFlightRecorder(capacity=16))
    seen = []
    c.error_hook = lambda op, e: seen.append(op)
    bundler = install_crash_bundles(c, tmp_path, max_bundles=1)
    for _ in range(2):
        with pytest.raises(CacheOutOfMemory):
            c.alloc(32, req_id="big")
    assert len(bundler.written) == 1 and bundler.skipped == 1 and seen == ["alloc", "alloc"]
    assert c.bundle_writer == bundler.dump
    bundler.uninstall()
    assert c.error_hook is not bundler and c.bundle_writer is None
    with pytest.raises(FileExistsError, match="already exists"):
        write_bundle(c, bundler.written[0])
    with pytest.raises(ValueError, match="is a file"):
        install_crash_bundles(c, bundler.written[0])
    with pytest.raises(ValueError, match="max_bundles=0"):
        install_crash_bundles(c, tmp_path, max_bundles=0)
    with pytest.raises(TypeError, match="needs a HiRadixCache, got str"):
        write_bundle("cache", tmp_path / "x.db")


@pytest.fixture
def bundle_file(tmp_path) -> Path:
    c = HiRadixCache(make_config(device_tokens=512, host_tokens=1024),
                     recorder=KeyframedFlightRecorder(capacity=64))
    Driver(c).insert(A * 40, req_id="r1")
    return write_bundle(c, tmp_path / "good.db")


def test_truncated_bundle_is_a_clear_error(bundle_file, tmp_path):
    data = bundle_file.read_bytes()
    cut = tmp_path / "cut.db"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.db' is truncated: its SQLite header says"):
        load_bundle(cut)
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        load_bundle(empty)


def test_wrong_files_are_clear_errors(bundle_file, tmp_path):
    js = tmp_path / "bundle.json"
    js.write_text('{"nodes": []}')
    with pytest.raises(ValueError, match=r"bundle\.json' is not a radixscope crash bundle or "
                                         r"telemetry store: not an SQLite file"):
        load_bundle(js)
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(ValueError, match="is not a radixscope telemetry store"):
        load_bundle(other)
    with pytest.raises(FileNotFoundError):
        load_bundle(tmp_path / "missing.db")
    with pytest.raises(ValueError, match="is a directory"):
        load_bundle(tmp_path)


def edit(path: Path, sql: str, *args) -> None:
    con = sqlite3.connect(path)
    con.execute(sql, args)
    con.commit()
    con.close()


def test_damaged_rows_are_a_clear_error(bundle_file, tmp_path):
    data = bytearray(bundle_file.read_bytes())
    at = data.find(b"node.create")
    data[at:at + 11] = b"X" * 11  # one mutation's kind, inside a data page
    bad = tmp_path / "bad.db"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is damaged: the rows of table 'mutations' do not "
                                         "match the manifest's SHA-256"):
        load_bundle(bad)


def test_damaged_or_foreign_version_bundles_are_clear_errors(bundle_file):
    n = sqlite3.connect(bundle_file).execute("SELECT count(*) FROM mutations").fetchone()[0]
    edit(bundle_file, "UPDATE journal SET data = (SELECT json_group_array(json(m.value)) FROM "
                      "json_each(journal.data) m WHERE json_extract(m.value, '$[0]') <= 10)")
    with pytest.raises(ValueError, match=rf"table 'mutations' has 10 rows, its manifest says {n}"):
        load_bundle(bundle_file)
    edit(bundle_file, "UPDATE info SET value = ? WHERE key = 'bundle'",
         '{"format": "radixscope.bundle", "version": 99}')
    with pytest.raises(ValueError, match="has format version 99; this reader reads 3, 4"):
        load_bundle(bundle_file)
    edit(bundle_file, "UPDATE info SET value = ? WHERE key = 'schema'",
         '{"name": "radixscope.telemetry", "version": 7}')
    with pytest.raises(ValueError, match="has schema version 7"):
        load_bundle(bundle_file)


def test_a_cache_without_a_recorder_still_gets_a_bundle_of_its_state(tmp_path):
    c = HiRadixCache(make_config())
    Driver(c).insert(A)
    r = load_bundle(write_bundle(c, tmp_path / "b.db", note="no recorder"))
    w = r.manifest()["window"]
    assert (w["recorder"], w["ops"], w["mutations"], w["keyframe_seq"]) == (None, 0, 0, 0)
    assert r.snapshot() == c.snapshot() and r.state_at(0) == c.snapshot()
    assert r.failure()["note"] == "no recorder" and "cuda_memory" not in r.info()


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_cuda_bundle_holds_the_torch_memory_snapshot(tmp_path):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        c = HiRadixCache(make_config(device="cuda"), recorder=KeyframedFlightRecorder(64))
        Driver(c).insert(A, req_id="r1")
        r = load_bundle(write_bundle(c, tmp_path / "cuda.db", cuda_memory=True))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    cm = r.info()["cuda_memory"]
    assert cm["device"] == "cuda" and cm["allocated"] > 0
    assert cm["snapshot"]["segments"] and "device_traces" in cm["snapshot"]
