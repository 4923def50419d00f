"""What the drain thread costs the cache's thread in wall-clock time (issue 17).

``bench_scale.py`` counts the cache thread's CPU time, which does not see the GIL: while the
drain thread holds it (taking a batch of ~4,096 encoded records, pickling a message, writing
it to the writer's pipe), the cache's thread waits, and a serving loop's step waits with it.
This bench runs ``bench_scale.py``'s workload (long multi-turn chat over shared system
prompts, ~1-3 k-token requests, page size 1, FULL only, ~1 k resident nodes) on two caches in
one process, batch by batch: the baseline (no recorder) and full telemetry (``telemetry.setup``:
writer process, store, spans). Per request it reads the wall clock, the thread's CPU time and
its voluntary context switches (``getrusage(RUSAGE_THREAD)``: a thread that waits for the GIL
sleeps, a switch it makes itself; a preempted one is switched out involuntarily).

Printed per cache: requests that waited (a voluntary switch), the time they lost (wall less CPU
time) per 1,000 requests, the p99.9 and the longest loss of any request; and, for telemetry, the
drain thread's CPU time per cycle that shipped (median and longest, its own cycles only; part of it
runs with the GIL released: the batch's copy out of the sink, the write to the pipe). On this
project's 2-core machines the writer process and the drain thread share the cores with the cache's
thread, so the preempted requests (involuntary switches only) are printed apart: they measure the
machine, not the GIL.

    python bench/bench_drain.py
    python bench/bench_drain.py --requests 3000 --reps 4
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale_workload import Chat, fill, make_cache, one_request  # noqa: E402

NODES = 1_000
DRAIN = "radixscope-telemetry-drain"


def timed_drain(pipeline) -> list[tuple[int, int]]:
    """Wrap the pipeline's drain cycle: ``(CPU ns, records shipped)`` of each cycle the drain
    thread runs (flush and close, on other threads, are not counted)."""
    cycles: list[tuple[int, int]] = []
    inner = pipeline._drain

    def drain() -> int:
        if threading.current_thread().name != DRAIN:
            return inner()
        c0 = time.thread_time_ns()
        shipped = inner()
        cycles.append((time.thread_time_ns() - c0, shipped))
        return shipped

    pipeline._drain = drain
    return cycles


def batch(c, chat: Chat, n: int, out: list) -> None:
    keys = [chat.next() for _ in range(n)]
    rusage = resource.getrusage
    for k, key in enumerate(keys):
        r0 = rusage(resource.RUSAGE_THREAD)
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        one_request(c, key, None, f"r{k}")
        lost = time.perf_counter_ns() - w0 - (time.thread_time_ns() - c0)
        r1 = rusage(resource.RUSAGE_THREAD)
        out.append((lost, r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw))


def report(label: str, rows: list) -> None:
    n = len(rows)
    lost = sorted(x[0] for x in rows)
    waited = [x[0] for x in rows if x[1]]
    pre = [x[0] for x in rows if not x[1] and x[2]]
    print(f"  {label}: {n} requests; lost (wall less CPU) p99.9 {lost[int(n * 0.999)] / 1e3:.0f}"
          f" us, longest {lost[-1] / 1e3:.0f} us")
    print(f"    waited (voluntary switch): {len(waited)} requests, "
          f"{sum(waited) / 1e6 / n * 1e3:.2f} ms lost per 1,000 requests, longest "
          f"{max(waited, default=0) / 1e3:.0f} us")
    print(f"    preempted only (involuntary): {len(pre)} requests, "
          f"{sum(pre) / 1e6 / n * 1e3:.2f} ms lost per 1,000 requests")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per batch")
    ap.add_argument("--reps", type=int, default=3, help="batches per cache, interleaved")
    args = ap.parse_args()
    from radixscope import telemetry

    with tempfile.TemporaryDirectory(prefix="bench_drain_") as tmp:
        tel = telemetry.setup(store=os.path.join(tmp, "t.db"), overwrite=True)
        caches = {"baseline": make_cache(NODES, ("full",), None),
                  "telemetry": make_cache(NODES, ("full",), tel.recorder)}
        chats = {k: Chat(active=max(16, NODES // 12)) for k in caches}
        for k, c in caches.items():
            fill(c, chats[k], NODES)
        tel.flush()
        cycles = timed_drain(tel.pipeline)
        rows: dict[str, list] = {k: [] for k in caches}
        for _ in range(args.reps):
            for k, c in caches.items():
                batch(c, chats[k], args.requests, rows[k])
                if c.recorder is tel.recorder:
                    tel.flush()  # the baseline's batch runs with the drain thread idle
        ours = [x for x in cycles if x[1]]
        tel.close()
    print(f"drain thread against the cache's thread: {NODES} resident nodes, FULL, "
          f"{args.reps} interleaved batches x {args.requests} requests per cache")
    for k, r in rows.items():
        report(k, r)
    shipping = [cpu for cpu, _ in ours]
    if shipping:
        records = sum(s for _, s in ours)
        print(f"  drain thread: {len(shipping)} cycles shipped {records} records; CPU a cycle "
              f"median {statistics.median(shipping) / 1e6:.2f} ms, longest "
              f"{max(shipping) / 1e6:.2f} ms; {sum(c for c, _ in ours) / records:.0f} us per "
              "1,000 records")
    else:
        print("  drain thread: shipped nothing during the batches (close shipped it all)")


if __name__ == "__main__":
    main()
