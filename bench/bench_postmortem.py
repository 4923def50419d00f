"""What crash-bundle readiness costs: a keyframed flight recorder vs the plain one, and the
time to write and open a bundle.

Same seeded chat workload as ``bench_telemetry.py`` (match -> load_back -> lock -> alloc ->
insert -> unlock -> poll), run in one process with three recorders, interleaved over several
repetitions (median reported):

- ``null``: the cache's default ``NullRecorder`` (nothing recorded);
- ``flight``: ``radixscope.cache.events.FlightRecorder`` (rings only; a bundle after the ring wrapped holds
  the failure state but cannot rebuild earlier seqs);
- ``keyframed``: ``radixscope.telemetry.capture.flight.KeyframedFlightRecorder`` (mutations leaving the ring are
  replayed into a keyframe, so every seq in the window can be rebuilt).

The ring is deliberately small (``--capacity``) so it wraps many times and the keyframe cost is
paid in full. Then one bundle is written from the keyframed run and opened again.

    python bench/bench_postmortem.py --turns 3000 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_telemetry import ChatWorkload, make_cache

from radixscope.cache.events import FlightRecorder
from radixscope.telemetry.analysis.load import load_bundle
from radixscope.telemetry.capture.bundle import write_bundle
from radixscope.telemetry.capture.flight import KeyframedFlightRecorder

KINDS = ("null", "flight", "keyframed")


def run_once(kind: str, turns: int, seed: int, capacity: int):
    rec = {"null": None, "flight": FlightRecorder(capacity=capacity),
           "keyframed": KeyframedFlightRecorder(capacity=capacity)}[kind]
    cache = make_cache(rec)
    wl = ChatWorkload(seed, write_kv=False)
    for i in range(max(1, turns // 10)):
        wl.turn(cache, f"w{i}")
    wl.ops = 0
    t0 = time.perf_counter()
    for i in range(turns):
        wl.turn(cache, f"r{i}")
    return wl.ops / (time.perf_counter() - t0), cache


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--capacity", type=int, default=2048, help="op records in the ring")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    last = None
    for _ in range(args.reps):
        for kind in KINDS:
            rate, cache = run_once(kind, args.turns, args.seed, args.capacity)
            rates[kind].append(rate)
            if kind == "keyframed":
                last = cache
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"workload: chat, {args.turns} turns x {args.reps} reps, ring {args.capacity} ops / "
          f"{4 * args.capacity} mutations")
    for k in KINDS:
        print(f"  {k:9s}: {med[k]:9.0f} ops/s  (reps: {', '.join(f'{r:.0f}' for r in rates[k])})")
    print(f"ratio keyframed/flight {med['keyframed'] / med['flight']:.3f}  "
          f"flight/null {med['flight'] / med['null']:.3f}  "
          f"keyframed/null {med['keyframed'] / med['null']:.3f}")
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        snap_t = time.perf_counter()
        live = last.snapshot()
        snap_s = time.perf_counter() - snap_t
        t0 = time.perf_counter()
        path = write_bundle(last, Path(d) / "bench.db")
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = load_bundle(path)
        ok = r.state_at(live.seq) == live
        open_s = time.perf_counter() - t0
        w = r.manifest()["window"]
        print(f"bundle: {w['ops']} ops, {w['mutations']} mutations, {len(live.nodes)} nodes, "
              f"{path.stat().st_size / 1e6:.1f} MB; write {write_s * 1e3:.0f} ms "
              f"({write_s / snap_s:.0f}x one cache.snapshot()), open + state_at(failure) "
              f"{open_s * 1e3:.0f} ms, round trip exact: {ok}")


if __name__ == "__main__":
    main()
