"""What the KV-event publisher costs: full telemetry with vs without ``kv_events``, one process.

Both sides are ``telemetry.setup(store=...)`` with ``bench_telemetry``'s settings (every op
recorded, spanned and journaled); the "on" side adds ``kv_events`` (a PUB socket and a replay
ROUTER socket on free 127.0.0.1 ports), whose publisher diffs the resident blocks after every
batch the sinks handle and sends them in vLLM's format. No subscriber is connected (ZMQ drops
the frames after encoding), so this is the publisher's own cost: the block diff, hashing and
msgpack encoding. ``--mode process`` (the default) runs the sinks, the publisher included, in
the writer process: the cache's thread pays only for sharing the machine with it; ``--mode
inline`` runs them on this process's drain thread (the harsher case).

Pairs alternate order (without/with, then with/without); the headline is the median of the
per-pair ratios (without-time / with-time: 1.0 = free) with quartiles, as in
``bench_telemetry.py``. ``hot`` times the workload; ``e2e`` until ``tel.flush()`` returns,
i.e. every batch is stored and published.

    python bench/bench_kv_events.py --workload engine --requests 200 --reps 11
    python bench/bench_kv_events.py --workload both --mode inline --reps 7
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import bench_telemetry as bt  # noqa: E402

from radixscope import telemetry  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_side(prepare, kv: bool, mode: str, tmp: Path, tag: str) -> dict:
    bt.SETUP.clear()
    bt.SETUP["mode"] = mode
    if kv:
        bt.SETUP["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{free_port()}",
                                 "replay_endpoint": f"tcp://127.0.0.1:{free_port()}"}
    else:
        bt.SETUP["kv_events"] = False
    if mode == "process":
        return bt.measure(prepare, True, tmp, tag)
    return measure_inline(prepare, tmp, tag)


def measure_inline(prepare, tmp: Path, tag: str) -> dict:
    """``bt.measure`` for inline mode (no writer process: the sinks run on the drain thread,
    whose CPU is in this process's column)."""
    tel = telemetry.setup(store=tmp / f"{tag}.db", overwrite=True, capture_host_spans=False,
                          **bt.SETUP)
    run = prepare(tel.recorder, tel)
    tel.flush()
    c0, th0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    run()
    out = {"hot_s": time.perf_counter() - t0, "thread_cpu_s": time.thread_time() - th0}
    tel.flush(timeout_s=600)
    out["e2e_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - c0
    out["writer_cpu_s"] = 0.0
    stats = tel.close(timeout_s=600)
    out["dropped"] = sum(stats["dropped"].values())
    out["failures"] = sum(stats["failures"].values())
    with telemetry.open_store(tel.store_path) as r:
        out["ops"] = len(r.ops())
    tel.store_path.unlink(missing_ok=True)
    return out


def quartiles(xs: list[float]) -> list[float]:
    return statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3


def bench(name: str, prepare, reps: int, mode: str, tmp: Path) -> dict:
    base, kv = [], []
    for rep in range(reps):
        for side in ((False, True) if rep % 2 == 0 else (True, False)):
            (kv if side else base).append(run_side(prepare, side, mode, tmp, f"{name}-{rep}"))
    n = kv[0]["ops"]
    assert all(r["ops"] == n for r in base + kv), "runs recorded different numbers of ops"
    med = statistics.median
    hot = [a["hot_s"] / b["hot_s"] for a, b in zip(base, kv, strict=True)]
    e2e = [a["e2e_s"] / b["e2e_s"] for a, b in zip(base, kv, strict=True)]
    print(f"[{name}, {mode}] {n} op records per run, {reps} pairs")
    for a, b, h, e in zip(base, kv, hot, e2e, strict=True):
        print(f"    without {n / a['hot_s']:8.0f} ops/s | with {n / b['hot_s']:8.0f} ops/s | "
              f"ratio hot {h:.3f} e2e {e:.3f} | dropped {b['dropped']} failures {b['failures']}")
    (h1, _, h3), (e1, _, e3) = quartiles(hot), quartiles(e2e)
    print(f"  RATIO with/without kv_events (median of per-pair ratios)  hot {med(hot):.3f} "
          f"(quartiles {h1:.3f}-{h3:.3f})   e2e {med(e2e):.3f} (quartiles {e1:.3f}-{e3:.3f})")
    print(f"  CPU us/op  cache thread {med(r['thread_cpu_s'] for r in base) / n * 1e6:.1f} -> "
          f"{med(r['thread_cpu_s'] for r in kv) / n * 1e6:.1f}   this process "
          f"{med(r['cpu_s'] for r in base) / n * 1e6:.1f} -> "
          f"{med(r['cpu_s'] for r in kv) / n * 1e6:.1f}   writer "
          f"{med(r['writer_cpu_s'] for r in base) / n * 1e6:.1f} -> "
          f"{med(r['writer_cpu_s'] for r in kv) / n * 1e6:.1f}")
    print(f"  dropped {sum(r['dropped'] for r in kv)}, failures {sum(r['failures'] for r in kv)}")
    return {"hot": med(hot), "e2e": med(e2e)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=("engine", "cache", "both"), default="engine")
    ap.add_argument("--requests", type=int, default=200, help="engine chat requests per run")
    ap.add_argument("--turns", type=int, default=1000, help="bare-loop turns per run")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=("process", "inline"), default="process")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.workload in ("engine", "both"):
            bench("engine chat", bt.engine_workload(args.requests, args.seed), args.reps,
                  args.mode, tmp)
        if args.workload in ("cache", "both"):
            bench("bare cache loop", bt.cache_workload(args.turns, args.seed), args.reps,
                  args.mode, tmp)


if __name__ == "__main__":
    main()
