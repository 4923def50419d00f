"""The engine on the L3 tier: a second ``radixscope run`` with the same file store hits in L3
what the first wrote; two engine processes at the same time share one real redis-server
(127.0.0.1, started and stopped by the test) and the second hits what the first wrote. Every
reused prefix is verified against the stand-in model, so a hit is a correct hit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from radixscope.cache.storage import RedisBackend
from radixscope.engine.cli import main
from radixscope.engine.run import RunSpec, execute
from radixscope.engine.summary import summarize
from tests.kits.storagekit import redis_server  # noqa: F401 -- fixture

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--workload", "chat", "--seed", "3", "--no-store", "--no-progress",
         "--prefetch-threshold", "16", "--prefetch-policy", "wait_complete"]


def _storage_pct(out: str) -> float:
    """The FULL row's storage column of the summary table."""
    assert re.search(r"hit rate .* storage$", out, re.M), out
    row = re.search(r"^\s+full\s.*?([\d.]+)%$", out, re.M)
    assert row, out
    return float(row.group(1))


def test_second_run_hits_in_l3_what_the_first_wrote(tmp_path, capsys):
    spec = RunSpec(workload="chat", requests=12, seed=3, store=None, check_invariants=True,
                   storage=f"file:{tmp_path / 'l3'}", prefetch_policy="wait_complete",
                   prefetch_threshold=16, telemetry_mode="inline")
    first = execute(spec)
    assert first.ok, first.error
    s1 = summarize(first)
    assert s1.hits[0].storage == 0  # a cold store: nothing to bring
    assert "pages written (none failed)" in s1.storage_line
    assert main(["run", "--requests", "12", "--storage", f"file:{tmp_path / 'l3'}",
                 "--check-invariants", *SMALL]) == 0
    out = capsys.readouterr().out
    assert _storage_pct(out) > 0, out  # the second run's prefixes came from L3
    assert "content      " in out and "no mismatch" in out
    assert "invariants   ok" in out


def test_write_back_pages_are_counted_in_the_summary(tmp_path):
    """Under ``--storage-write write_back`` pages are written as eviction demotes their nodes;
    the summary counts them with the rest, and the files are there."""
    spec = RunSpec(workload="chat", requests=20, seed=3, store=None, preset="full",
                   sizes=dict(device_tokens=1024, host_tokens=2048),
                   storage=f"file:{tmp_path / 'l3'}", storage_write="write_back",
                   telemetry_mode="inline")
    r = execute(spec)
    assert r.ok, r.error
    w = r.cache.cache.storage_stats().writes
    assert w.write_back_pages > 0
    line = summarize(r).storage_line
    m = re.search(r": ([\d,]+) pages written \(([\d,]+) of them by write_back, ", line)
    assert m, line
    written = int(m.group(1).replace(",", ""))
    assert written == w.pages_stored + w.write_back_pages
    assert int(m.group(2).replace(",", "")) == w.write_back_pages
    assert written == sum(1 for p in (tmp_path / "l3").rglob("*") if p.is_file()
                          and not p.name.startswith("."))


def test_a_run_closes_the_l3_backend_it_opened(redis_server):  # noqa: F811
    """``execute`` opens the L3 backend (before the store) and closes it at the end: no
    connection of the run's is left on the server, and the summary reads the counters kept at
    the end rather than opening one again."""
    import redis

    url = f"redis://127.0.0.1:{redis_server.port}"
    r = execute(RunSpec(workload="chat", requests=4, store=None, storage=url,
                        telemetry_mode="inline"))
    assert r.ok, r.error
    assert "pages written (none failed)" in summarize(r).storage_line
    probe = redis.Redis.from_url(url)
    try:
        assert probe.dbsize() > 0  # the run did use the server
        deadline = time.monotonic() + 10
        while len(probe.client_list()) > 1:  # the probe's own connection
            assert time.monotonic() < deadline, probe.client_list()
            time.sleep(0.05)
    finally:
        probe.close()


def _engine(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "radixscope.engine.cli", "run", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_two_engine_processes_share_one_redis(redis_server):  # noqa: F811
    url = f"redis://127.0.0.1:{redis_server.port}"
    first = _engine(["--requests", "200", "--storage", url, *SMALL])
    second = None
    try:
        probe = RedisBackend(url)
        deadline = time.monotonic() + 120
        # bounded: wait until the first engine has written what its first 20 requests cache
        # (4,416 pages for this workload and seed), while it keeps running
        while probe.stats().stored_pages < 4500:
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the first engine never wrote to redis"
            time.sleep(0.05)
        probe.close()
        concurrent = first.poll() is None
        second = _engine(["--requests", "200", "--storage", url, *SMALL])  # the same workload
        out2, err2 = second.communicate(timeout=240)
        out1, err1 = first.communicate(timeout=300)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    assert concurrent, "the first engine had finished before the second started"
    assert _storage_pct(out2) > 0, out2  # the second process hit what the first wrote
    assert "no mismatch" in out2 and "pages written" in out1


def _l3_engine(tmp_path, reqs, backend=None):
    from radixscope.cache import CacheConfig, HiRadixCache
    from radixscope.cache.storage import FileBackend, PrefetchConfig, StorageSetup
    from radixscope.engine.engine import Engine, EngineConfig
    from radixscope.engine.instrument import CountingRecorder, TimedCache

    cfg = CacheConfig.preset("full", device_tokens=64, host_tokens=128)
    setup = StorageSetup(backend or FileBackend(tmp_path / "l3"),
                         prefetch=PrefetchConfig(policy="wait_complete", threshold_tokens=16))
    counter = CountingRecorder()
    cache = TimedCache(HiRadixCache(cfg, recorder=counter, storage=setup), counter)
    return Engine(cache, reqs, EngineConfig(chunk_tokens=16, prefill_budget=32, max_running=2,
                                            check_invariants=True))


def test_no_admission_while_prefetching_and_abort_on_leave(tmp_path):
    from radixscope.cache.storage import FileBackend
    from radixscope.engine.request import RequestSpec
    from radixscope.engine.workloads.base import Tokens
    from tests.kits.prefetchkit import Gate

    tok = Tokens(7)
    a, x = tok.ids(44), tok.ids(14)
    first = _l3_engine(tmp_path, [RequestSpec("A", a, 40)])
    first.run()
    first.cache.cache.close()
    gate = Gate(FileBackend(tmp_path / "l3"), lambda n, keys: True)
    e = _l3_engine(tmp_path, [RequestSpec("A2", a, 40), RequestSpec("X", x, 12)], gate)
    seen = []

    def watch(engine):
        seen.append((engine.step_no, [s.rid for s in engine.waiting],
                     [s.rid for s in engine.running + engine.done]))
        if engine.step_no == 6:
            gate.release()
    e.on_step = watch
    e.run()
    c = e.cache.cache
    # A2's prefetch held its admission back while X (below the prefetch threshold) ran
    assert seen[0] == (1, ["A2"], ["X"])
    assert all("A2" in waiting for _, waiting, _ in seen[:5])
    done = {s.rid: s for s in e.done}
    assert (done["A2"].prefetch_status, done["X"].prefetch_status) == ("started",
                                                                       "below_threshold")
    assert done["A2"].storage_hit == 40 and done["A2"].host_hit == 40
    assert e.admitter.verified_tokens >= 40  # the L3 prefix was verified against the model
    # every request left: nothing pending, no pin, states forgotten
    assert c.pending_prefetches() == [] and c.prefetch_state("A2") is None
    assert not any(str(k.owner).startswith("prefetch:") for k in c.locks.values())
    c.check()
    c.close()


def test_admission_does_not_admit_a_request_whose_prefetch_it_just_started(tmp_path):
    """A request whose arrival left no prefetch running (declined then: rate limit, host
    room) may find one started by admission's own match: it waits for the hand-back like any
    prefetching request, instead of prefilling the tokens the prefetch is fetching."""
    from radixscope.cache.storage import FileBackend
    from radixscope.engine.admit import ADMITTED, REFUSED
    from radixscope.engine.model import prefix_hashes
    from radixscope.engine.request import RequestSpec, Sequence
    from radixscope.engine.workloads.base import Tokens
    from tests.kits.prefetchkit import Gate

    a = Tokens(7).ids(44)
    first = _l3_engine(tmp_path, [RequestSpec("A", a, 40)])
    first.run()
    first.cache.cache.close()
    gate = Gate(FileBackend(tmp_path / "l3"), lambda n, keys: True)
    e = _l3_engine(tmp_path, [], gate)
    c = e.cache.cache
    spec = RequestSpec("A2", a, 40)
    seq = Sequence(spec, prefix_hashes(spec.tokens, spec.extra_key))  # no arrival prefetch
    assert e.admitter.try_admit(seq, 16, True, {}) == REFUSED
    assert c.prefetch_state("A2").status == "ongoing" and seq.phase != "prefill"
    assert "L3 prefetch" in seq.last_reason
    gate.release()
    for _ in range(200):  # bounded: the hand-back comes with a poll once the worker is done
        c.poll()
        if c.prefetch_state("A2").status == "done":
            break
        time.sleep(0.01)
    assert e.admitter.try_admit(seq, 16, True, {}) == ADMITTED
    assert seq.storage_hit == 40
    c.check()
    c.close()
