"""One process runs a workload writing the store (process mode: a writer process behind it)
while this process reads the store in a loop and checks its content at ten checkpoints of the
workload. The reader never errors; afterwards the store
holds every op issued, or the dropped counter accounts for each missing one, and the journal
replays to the workload's final snapshot."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from radixscope import telemetry
from radixscope.cache.snapshot import CacheSnapshot

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = r"""
import json, os, sys, time
from opentelemetry import trace
from radixscope import telemetry
from radixscope.cache import CacheOutOfMemory, HiRadixCache
from tests.kits.cachekit import Driver, make_config

store, out, n, phases = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
tel = telemetry.setup(store=store, keyframe_every=200, sample_every_ms=1)
c = HiRadixCache(make_config(("full", "swa"), device_tokens=96, host_tokens=192),
                 recorder=tel.recorder)
d = Driver(c)
tracer = trace.get_tracer("tests.engine")
per_phase = n // PHASES
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
    if (i + 1) % per_phase == 0:  # a checkpoint the reader verifies while writing goes on
        k = (i + 1) // per_phase
        tel.flush()
        snap = c.snapshot()
        tmp = os.path.join(phases, f".phase-{k}")
        json.dump({"seq": snap.seq, "ops": c._op_id, "snapshot": snap.to_dict()}, open(tmp, "w"))
        os.replace(tmp, os.path.join(phases, f"phase-{k}.json"))
        if k < PHASES:
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(phases, f"ack-{k}")):
                if time.monotonic() > deadline:
                    sys.exit(3)
                time.sleep(0.005)
c.poll()
stats = tel.close()
json.dump({"ops": c._op_id, "stats": stats, "snapshot": c.snapshot().to_dict(),
           "requests": n}, open(out, "w"))
""".replace("PHASES", "10")
PHASES = 10


def _hammer(r: telemetry.StoreReader, rng: random.Random, seen_seq: int) -> int:
    """A burst of reads of every kind on one store while it is written; returns the last seq.
    Every read is a consistent snapshot: the store only grows, a rebuilt tree is at the seq
    asked for, a range of the journal has no hole."""
    r.ops()
    r.spans(include_cache=False)
    r.metrics()
    r.events()
    kf = r.keyframes()
    if kf.empty:
        return seen_seq
    last = r.last_seq()
    assert last >= seen_seq  # the store only grows
    first = int(kf["seq"].min())
    for _ in range(3):
        seq = rng.randint(first, last)
        assert r.state_at(seq).seq == seq
        lo = rng.randint(first, last)
        seqs = r.mutations(lo, lo + 50)["seq"].tolist()
        # no hole, and at least up to what last_seq() promised (the writer may have gone on)
        assert seqs == list(range(lo, lo + len(seqs)))
        assert len(seqs) >= min(lo + 50, last) - lo + 1
    return last


def test_reader_in_another_process_never_errors_and_the_store_is_complete(tmp_path):
    """The writer pauses after each tenth of the workload until this process has checked the
    store against the workload's own snapshot at that point; in between, and while the
    workload goes on, the reader hammers the store with reads of every kind."""
    store, out, phases = tmp_path / "live.db", tmp_path / "result.json", tmp_path / "phases"
    phases.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(store), str(out), "400",
                             str(phases)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    rng = random.Random(0)
    reads = verified = 0
    seen_seq = -1
    reader = None
    deadline = time.monotonic() + 240
    try:
        while verified < PHASES and time.monotonic() < deadline:
            if reader is None:
                if not store.exists():
                    assert proc.poll() is None, proc.communicate()[0].decode()
                    time.sleep(0.01)
                    continue
                reader = telemetry.open_store(store)  # one long-lived reader, as the UI keeps
            seen_seq = _hammer(reader, rng, seen_seq)
            reads += 1
            phase = phases / f"phase-{verified + 1}.json"
            if phase.exists():  # the workload is paused at this checkpoint: check content
                want = json.loads(phase.read_text())
                assert reader.state_at(want["seq"]) == CacheSnapshot.from_dict(want["snapshot"])
                ids = reader.ops()["op_id"].tolist()
                assert ids[:want["ops"]] == list(range(1, want["ops"] + 1))
                verified += 1
                (phases / f"ack-{verified}").touch()
            elif proc.poll() is not None:
                break
    finally:
        if reader is not None:
            reader.close()
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 0, output
    assert verified == PHASES and reads >= PHASES, (verified, reads)
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
        assert len(r.events(kind="admission")) == result["requests"] // 10
        assert result["stats"]["failures"] == {}


def test_flushing_from_another_thread_loses_and_reorders_nothing(tmp_path):
    """Records are encoded in batches; a flush seals the partial batch from whatever thread
    calls it. With a thread flushing in a loop while this one runs cache ops, the store still
    holds every op exactly once, in order, and the journal replays to the final snapshot."""
    import threading

    from radixscope.cache import HiRadixCache
    from tests.kits.cachekit import Driver, make_config

    tel = telemetry.setup(store=tmp_path / "f.db", capture_host_spans=False)
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=128), recorder=tel.recorder)
    d = Driver(c)
    asks = threading.Semaphore(0)  # one release = one flush asked of the other thread
    flushes = [0]
    asked = 0
    stop = threading.Event()

    def flusher() -> None:
        while True:
            asks.acquire()
            if stop.is_set():
                return
            tel.flush()  # runs while the cache thread goes on with its ops
            flushes[0] += 1

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(600):
            d.insert([i % 5, i % 3, i, 7], req_id=f"r{i}")
            if i % 4 == 0:
                c.poll()
            if i % 20 == 0:  # a flush asked mid-stream, every 20 inserts (not waited for)
                asks.release()
                asked += 1
    finally:
        stop_after = asked
        while flushes[0] < stop_after and t.is_alive():  # every flush asked has run
            t.join(0.01)
        stop.set()
        asks.release()
        t.join()
    stats = tel.close()
    assert flushes[0] == asked == 30
    assert sum(stats["dropped"].values()) == 0 and stats["failures"] == {}
    with telemetry.open_store(tmp_path / "f.db") as r:
        ids = r.ops()["op_id"].tolist()
        assert ids == list(range(1, c._op_id + 1))
        assert r.state_at(r.last_seq()) == c.snapshot()
