"""Every bench under ``bench/`` runs: each at its smallest size, through its own command line, and
prints the line its reader looks for. A bench that imports a name a refactor moved, or whose
fill never ends at a size it accepts, fails here, not in the next round's measurements.
(``bench_scale.py`` and ``bench_record_cost.py`` are run by ``test_bench_scale.py``;
``bench_gpu.py`` needs a GPU: ``tests/cache/test_gpu_staged.py``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

# bench and its arguments -> what its output must hold
RUNS = {
    "bench_writer.py --scale 1k --requests 30 --what both": ("drain: 1", "drained by close()"),
    "bench_close.py --nodes 200 --requests 30": ("state_at(last_seq) == snapshot: True",),
    "bench_ledger.py --scale 1k --requests 30 --reps 2 --steps": ("on, py ledger",),
    "bench_instructions.py --child on --requests 5": (),
    "bench_op_record.py --reps 2 --requests 100": ("full/plain",),
    "bench_cache.py --sizes 100 --requests 50 --reps 1": ("records on/off throughput",),
    "bench_drain.py --requests 30 --reps 2": ("drain thread:",),
    "bench_engine.py --reps 1 --requests 10": ("ratio req/s on / off",),
    "bench_hybrid.py --quick": ("hit_rate_gap_points",),
    "bench_keys.py --tokens 1000 --reps 1": ("array('i')",),
    "bench_kv_events.py --requests 10 --turns 10 --reps 1": ("dropped 0, failures 0",),
    "bench_postmortem.py --turns 10 --reps 1": ("round trip exact: True",),
    "bench_prefetch.py --rounds 1": ("wait_complete",),
    "bench_storage.py --rounds 1 --backends file": ("file ",),
    "bench_telemetry.py --requests 10 --turns 10 --reps 1": ("every op stored: dropped 0",),
    "bench_ui.py --nodes 100 --mutations 100 --reps 1 --probes 1": ("## state_at",),
}


@pytest.mark.parametrize("cmd", list(RUNS))
def test_the_bench_runs_at_its_smallest_size(cmd):
    script, *args = cmd.split()
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in RUNS[cmd]:
        assert line in out.stdout, (line, out.stdout[-3000:])


def test_a_fill_whose_pool_fills_short_of_its_nodes_ends():
    """At 200 nodes the pool (sized by the mean tokens a node) fills at ~160-180 nodes; the fill
    waited for 200 and ran 1.2 M requests (two and a half minutes) before one came by chance."""
    sys.path.insert(0, str(BENCH))
    import scale_workload as sw

    c = sw.make_cache(200, ("full",), None)
    n = sw.fill(c, sw.Chat(active=16), 200)
    assert c.available() <= c.config.device_tokens // 50
    assert len(c.tree.nodes) - 1 < 200 and n < 10 * sw.STALL
    c.check()


def test_every_bench_is_run_by_a_test():
    here = Path(__file__).resolve().parent
    tested = {cmd.split()[0] for cmd in RUNS}
    elsewhere = {name for name in ("bench_scale.py", "bench_record_cost.py", "bench_gpu.py")
                 if any(name in p.read_text() for p in here.rglob("test_*.py")
                        if p.name != Path(__file__).name)}
    benches = {p.name for p in BENCH.glob("bench_*.py")}
    assert benches - tested - elsewhere == set()
