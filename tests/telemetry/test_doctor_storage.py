"""The doctor's L3 findings: stuck prefetches (pending past their policy budget) and host pins
leaked by finished prefetches / store transfers; from snapshots, from a real store written by
the prefetch observer, and from crash bundles (pending prefetches, version 3 still readable)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache.snapshot import LockSnapshot, TransferSnapshot
from radixscope.cache.storage import PrefetchConfig
from radixscope.engine.doctor import diagnose
from radixscope.telemetry.analysis import storage_doctor as sd
from radixscope.telemetry.analysis.doctor import ERROR, WARNING
from radixscope.telemetry.analysis.load import load, load_bundle
from radixscope.telemetry.capture.bundle import write_bundle
from radixscope.telemetry.capture.flight import KeyframedFlightRecorder
from radixscope.telemetry.store.bundle_format import table_digest
from tests.kits.cachekit import Driver, make_config
from tests.kits.prefetchkit import Gate, P, Rig
from tests.kits.ui_snapshots import small_snapshot

S = 1_000_000_000


def _pending(*rows):
    return sd.pending_frame([{"req_id": r, "status": "ongoing", "asked_tokens": t,
                              "completed_tokens": c, "started_ns": s, "anchor": 3}
                             for r, t, c, s in rows])


def test_stuck_prefetch_is_past_its_budget_only():
    snap = small_snapshot()
    pend = _pending(("slow", 4096, 1024, 0), ("fresh", 4096, 0, 1 * S))
    # 4096 tokens: budget 1 s + 4 * 0.25 s = 2 s; at now = 2.5 s "slow" is 2.5 s old
    (f,) = sd.storage_findings(snap, pend, now_ns=int(2.5 * S))
    assert (f.severity, f.subject) == (WARNING, "prefetch slow")
    assert f.message == ("stuck prefetch: started 2.5 s ago for 4096 tokens (1024 landed), "
                         "never handed back; its timeout budget is 2.00 s")
    assert sd.storage_findings(snap, pend, now_ns=2 * S) == []
    cfg = PrefetchConfig(timeout_base_s=0.1, timeout_per_ki_token_s=0.0)
    assert [f.subject for f in sd.storage_findings(snap, pend, int(1.2 * S), cfg)] == [
        "prefetch slow", "prefetch fresh"]


def test_leaked_host_pins_of_finished_prefetches_and_store_transfers():
    base = small_snapshot()
    locks = (*base.locks,
             LockSnapshot(11, "prefetch:done", 4, "host", (("full", (4,)),)),
             LockSnapshot(12, "prefetch:running", 6, "host", (("full", (6,)),)),
             LockSnapshot(13, "store:77", 6, "host", (("full", (6, 3)),)),
             LockSnapshot(14, "store:9", 2, "host", (("full", (2,)),)))
    transfers = (*base.transfers, TransferSnapshot(77, "store", 6, "storage", (6, 3),
                                                   (("full", 7),)))
    snap = dataclasses.replace(base, locks=locks, transfers=transfers)
    found = sd.storage_findings(snap, _pending(("running", 64, 0, 0)), now_ns=0)
    assert [(f.severity, f.subject) for f in found] == [(ERROR, "lock 11"), (ERROR, "lock 14")]
    assert found[0].message.startswith("leaked host pin: 'prefetch:done' still pins node 4 "
                                       "(1 nodes) but that prefetch is finished")
    assert "'store:9'" in found[1].message and "store transfer is finished" in found[1].message


def test_pending_frame_rejects_what_is_not_a_prefetch_state():
    with pytest.raises(ValueError, match="pending prefetch 1: .* is not a prefetch state"):
        sd.pending_frame([{"req_id": "a", "asked_tokens": 1, "completed_tokens": 0,
                           "started_ns": 5}, {"req_id": 3}])


def test_doctor_names_a_prefetch_stuck_in_a_real_store(tmp_path):
    """A real controller reports into a real store through tel.prefetch_observer; one prefetch
    is held open by a gate when the run ends: the doctor says it is stuck."""
    tel = telemetry.setup(store=tmp_path / "run.db", mode="inline", capture_host_spans=False)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    rig = Rig(tmp_path, (), n_pages=8)
    rig.write()
    gate = Gate(rig.store, hold=lambda n, keys: True)
    ctl = rig.controller(gate, observer=tel.prefetch_observer)
    assert ctl.start("held", rig.hashes).started
    assert gate.entered.wait(10)
    time.sleep(0.01)
    Driver(c).insert([1, 2, 3], req_id="later")  # the store's last time is after the start
    tel.close()
    rpt = diagnose(str(tmp_path / "run.db"),
                   PrefetchConfig(timeout_base_s=0.0, timeout_per_ki_token_s=0.0))
    assert "storage: 1 prefetch pending" in rpt.text
    assert "WARNING prefetch held: stuck prefetch: started" in rpt.text
    assert f"for {8 * P} tokens (0 landed), never handed back" in rpt.text
    with load(tmp_path / "run.db") as r:
        assert list(r.prefetches()["req_id"]) == ["held"]
    # with the default budget (1 s + ...) the same store has a pending prefetch, not a stuck one
    assert "stuck" not in diagnose(str(tmp_path / "run.db")).text
    gate.release()
    ctl.close()


def test_bundle_keeps_the_pending_prefetches_and_reads_version_3(tmp_path):
    c = HiRadixCache(make_config(), recorder=KeyframedFlightRecorder(capacity=256))
    Driver(c).insert([1, 2, 3, 4], req_id="r1")
    path = write_bundle(c, tmp_path / "b.db")
    with load_bundle(path) as r:
        assert r.manifest()["version"] == 4
        assert r.prefetches().empty and list(r.prefetches().columns) == list(sd.PENDING_COLUMNS)
    # a version-3 bundle (no 'prefetches' row) still opens; the manifest re-digested as v3
    con = sqlite3.connect(path)
    meta = json.loads(con.execute("SELECT value FROM info WHERE key='bundle'").fetchone()[0])
    con.execute("DELETE FROM info WHERE key='prefetches'")
    meta["version"] = 3
    meta["digests"]["info"] = table_digest(con, "info")
    con.execute("UPDATE info SET value=? WHERE key='bundle'", (json.dumps(meta),))
    con.commit()
    con.close()
    with load_bundle(path) as r:
        assert r.manifest()["version"] == 3 and r.prefetches().empty
