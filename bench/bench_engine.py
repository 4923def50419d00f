"""Throughput of the default ``radixscope run`` and the share of its time inside cache calls.

Runs the default run (``RunSpec()``: chat workload, 200 requests, hybrid preset, write-through,
telemetry store on) and, as the in-process baseline, the same run with telemetry off
(``store=None``), alternating ``--reps`` times; medians are reported.

- ``req/s``: finished requests per second of the engine loop (``engine.run()``).
- ``e2e s``: the whole ``execute`` (building the workload and cache, the run, and
  ``telemetry.close()`` until the store holds everything).
- ``cache %``: time inside cache calls as the engine sees them (``TimedCache``: match,
  admission, load_back, poll, lock/unlock, alloc/free, insert...) over the loop's time.
- ``ops %``: the same from the cache's own op records (sum of op durations; transfers run in
  ``poll`` on CPU).
The rest of the loop is the stand-in model (writing KV, verifying every reused prefix), the
scheduler and the request spans.

    python bench/bench_engine.py            # 3 reps
    python bench/bench_engine.py --reps 5 --requests 300
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from radixscope.engine.run import RunSpec, execute


def one(spec: RunSpec) -> dict:
    t0 = time.perf_counter()
    r = execute(spec)
    e2e = time.perf_counter() - t0
    if r.error is not None:
        raise SystemExit(f"run failed: {r.error}")
    ops_ns = sum(sum(v) for v in r.counter.op_ns.values())
    return {"req_s": len(r.engine.done) / r.wall_s, "wall": r.wall_s, "e2e": e2e,
            "cache": r.cache.ns / 1e9 / r.wall_s, "ops": ops_ns / 1e9 / r.wall_s,
            "done": len(r.engine.done), "calls": r.cache.calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=None, help="default: the run's default")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        on = RunSpec(requests=args.requests, store=str(Path(d) / "bench.db"))
        off = replace(on, store=None)
        rows: dict[str, list[dict]] = {"telemetry off": [], "telemetry on (default)": []}
        for _ in range(args.reps):
            rows["telemetry off"].append(one(off))
            rows["telemetry on (default)"].append(one(on))
    print(f"default run: {on.workload}, preset {on.preset_name()}, "
          f"{rows['telemetry off'][0]['done']} requests, "
          f"{rows['telemetry off'][0]['calls']} cache calls; median of {args.reps}")
    print(f"{'':24} {'req/s':>8} {'loop s':>8} {'e2e s':>8} {'cache %':>8} {'ops %':>8}")
    med = {}
    for name, rs in rows.items():
        m = {k: statistics.median(r[k] for r in rs) for k in ("req_s", "wall", "e2e", "cache",
                                                               "ops")}
        med[name] = m
        print(f"{name:24} {m['req_s']:8.1f} {m['wall']:8.2f} {m['e2e']:8.2f} "
              f"{100 * m['cache']:8.1f} {100 * m['ops']:8.1f}")
    ratio = med["telemetry on (default)"]["req_s"] / med["telemetry off"]["req_s"]
    print(f"ratio req/s on / off: {ratio:.3f}")


if __name__ == "__main__":
    main()
