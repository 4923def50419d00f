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
