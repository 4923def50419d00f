"""One process runs a workload writing the store (process mode: a writer process behind it)
while this process reads the store in a loop. The reader never errors; afterwards the store
holds every op issued, or the dropped counter accounts for each missing one, and the journal
replays to the workload's final snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import telemetry
from cache.snapshot import CacheSnapshot

ROOT = Path(__file__).resolve().parents[1]

WORKLOAD = r"""
import json, sys
from opentelemetry import trace
import telemetry
from cache import CacheOutOfMemory, HiRadixCache
from tests.cachekit import Driver, make_config

store, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tel = telemetry.setup(store=store, keyframe_every=200, sample_every_ms=1)
c = HiRadixCache(make_config(("full", "swa"), device_tokens=96, host_tokens=192),
                 recorder=tel.recorder)
d = Driver(c)
tracer = trace.get_tracer("tests.engine")
for i in range(n):
    with tracer.start_as_current_span("request"):
        try:
            d.insert([i % 7, i % 5, i % 3, i, 1, 2, 3], req_id=f"r{i}")
        except CacheOutOfMemory:
            pass
        if i % 3 == 0:
            c.poll()
        if i % 10 == 0:
            c.evict(20)
            tel.record_admission(f"r{i}", True, need=7)
c.poll()
stats = tel.close()
json.dump({"ops": c._op_id, "stats": stats, "snapshot": c.snapshot().to_dict(),
           "requests": n}, open(out, "w"))
"""


def test_reader_in_another_process_never_errors_and_the_store_is_complete(tmp_path):
    store, out = tmp_path / "live.db", tmp_path / "result.json"
    proc = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(store), str(out), "200"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reads = states = 0
    seen_seq = -1
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if not store.exists():
            time.sleep(0.01)
            continue
        with telemetry.open_store(store) as r:  # opened while the writer appends
            ops = r.ops()
            r.mutations(start_seq=max(0, seen_seq - 50))
            r.spans(include_cache=False)
            r.metrics()
            r.events()
            if not ops.empty:
                last = r.last_seq()
                assert last >= seen_seq  # the store only grows
                seen_seq = last
                snap = r.state_at(last)  # a consistent rebuild mid-write
                assert snap.seq == last
                states += 1
            reads += 1
        time.sleep(0.05)  # leave the 2-core machine to the workload and its writer
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 0, output
    assert reads > 3 and states >= 1, (reads, states)
    result = json.loads(out.read_text())
    dropped = result["stats"]["dropped"]
    with telemetry.open_store(store) as r:
        ops = r.ops()
        assert len(ops) + dropped["op"] == result["ops"]  # every op stored or counted
        assert sorted(ops["op_id"]) == sorted(set(ops["op_id"]))
        if dropped["op"] == 0:
            assert list(ops["op_id"]) == list(range(1, result["ops"] + 1))
            assert r.state_at(r.last_seq()) == CacheSnapshot.from_dict(result["snapshot"])
        host = r.spans(name="request")
        assert len(host) + dropped["span"] == result["requests"]  # the process's own spans
        cache_spans = r.spans()
        assert cache_spans["name"].str.startswith("kv_cache.").sum() == len(ops)
        req_ids = set(host["span_id"])
        matches = cache_spans[cache_spans["name"] == "kv_cache.match"]
        assert set(matches["parent_span_id"]) <= req_ids  # parented on the request spans
        assert len(r.events(kind="admission")) == 20
        assert result["stats"]["failures"] == {}


def test_flushing_from_another_thread_loses_and_reorders_nothing(tmp_path):
    """Records are encoded in batches; a flush seals the partial batch from whatever thread
    calls it. With a thread flushing in a loop while this one runs cache ops, the store still
    holds every op exactly once, in order, and the journal replays to the final snapshot."""
    import threading

    from cache import HiRadixCache
    from tests.cachekit import Driver, make_config

    tel = telemetry.setup(store=tmp_path / "f.db", capture_host_spans=False)
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=128), recorder=tel.recorder)
    d = Driver(c)
    stop = threading.Event()
    flushes = [0]

    def flusher() -> None:
        while not stop.is_set():
            tel.flush()
            flushes[0] += 1

    t = threading.Thread(target=flusher)
    t.start()
    try:
        i = 0
        while i < 300 or (flushes[0] < 10 and i < 20000):  # ops interleaved with many flushes
            d.insert([i % 5, i % 3, i, 7], req_id=f"r{i}")
            if i % 4 == 0:
                c.poll()
            i += 1
    finally:
        stop.set()
        t.join()
    stats = tel.close()
    assert flushes[0] >= 10 and sum(stats["dropped"].values()) == 0 and stats["failures"] == {}
    with telemetry.open_store(tmp_path / "f.db") as r:
        ids = r.ops()["op_id"].tolist()
        assert ids == list(range(1, c._op_id + 1))
        assert r.state_at(r.last_seq()) == c.snapshot()
