"""What recording adds to each op on the cache's thread, in a hot loop (issue 17): op records
and state-change sites apart, in nanoseconds, in about ten seconds.

``bench_scale.py`` judges telemetry's cost on the chat workload, where one change to the
recording moves ops/s by less than the run-to-run noise. This bench repeats one request shape
on a small tree, so each op runs warm and the differences are tens of nanoseconds: a quick
check of a change to the recording before the long runs. Three caches, their batches
interleaved, each request driven as SGLang's scheduler drives a cache (match -> lock -> alloc
-> insert -> unlock, then an evict of what it added):

- ``plain``: no recorder (the baseline);
- ``records``: a recorder, the state-change sites off (``cache._on = False``): op records alone;
- ``full``: a recorder, everything recorded.

The recorders have no drain thread (their buffers are dropped between batches, outside the
timing), so the pipeline's share is not here: ``bench_scale.py --split`` measures that. A
request matches a 199-token prefix and adds a 200-token leaf, which the evict removes.

    python bench/bench_op_record.py
    python bench/bench_op_record.py --reps 15 --requests 3000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from scale_workload import make_cache  # noqa: E402

from radixscope.cache import TokenKey  # noqa: E402
from radixscope.telemetry.record.drops import Health  # noqa: E402
from radixscope.telemetry.record.recorder import TelemetryRecorder  # noqa: E402

OPS = ("match", "lock", "alloc", "insert", "unlock", "evict")
CLOCK = time.thread_time_ns
PREFIX = list(range(1, 200))


def _cache(recorder, sites: bool):
    c = make_cache(3, ("full",), recorder)
    key = TokenKey(PREFIX)
    c.insert(key, c.alloc(len(key)))
    c._on = c._on and sites  # the state-change sites check this flag; the ledger does not
    return c


def batch(c, keys: list[TokenKey]) -> dict[str, float]:
    """Mean CPU ns of each op over ``keys``."""
    t = dict.fromkeys(OPS, 0)
    for key in keys:
        t0 = CLOCK()
        m = c.match_prefix(key)
        t1 = CLOCK()
        r = c.lock(m.last_device_node)
        t2 = CLOCK()
        idx = c.alloc(len(key) - m.device_prefix_len)
        t3 = CLOCK()
        full = torch.cat([m.device_indices, idx])
        t4 = CLOCK()
        c.insert(key, full, prev_prefix_len=m.device_prefix_len)
        t5 = CLOCK()
        c.unlock(r)
        t6 = CLOCK()
        c.evict(len(key) - len(PREFIX))
        t7 = CLOCK()
        for op, a, b in zip(OPS, (t0, t1, t2, t4, t5, t6), (t1, t2, t3, t5, t6, t7), strict=True):
            t[op] += b - a
    return {op: ns / len(keys) for op, ns in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="interleaved batches per cache")
    ap.add_argument("--requests", type=int, default=3000, help="requests per batch")
    args = ap.parse_args()
    if args.reps < 1 or args.requests < 1:
        ap.error("--reps and --requests must be >= 1")
    torch.set_num_threads(1)
    recorders = {name: TelemetryRecorder(Health(), queue_capacity=1 << 62,
                                         encode_batch=1 << 62) for name in ("records", "full")}
    caches = {"plain": _cache(None, True), "records": _cache(recorders["records"], False),
              "full": _cache(recorders["full"], True)}
    # 50 distinct 200-token tails, so each request adds a leaf of its own
    keys = [TokenKey(PREFIX + [1000 + i % 50] * 200) for i in range(args.requests)]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in caches}
    for _ in range(args.reps):
        for name, c in caches.items():
            runs[name].append(batch(c, keys))
            rec = recorders.get(name)
            if rec is not None:  # dropped outside the timing: no pipeline here
                rec.seal()
                rec.take(1 << 62)
    for c in caches.values():
        c.check()

    def added(name: str, base: str, op: str) -> float:  # median of the rep-by-rep differences
        return statistics.median(a[op] - b[op] for a, b in zip(runs[name], runs[base],
                                                                strict=True))

    print(f"recording's cost per op, hot loop: {args.reps} interleaved batches x "
          f"{args.requests} requests (199-token prefix matched, 200-token leaf added and "
          "evicted); CPU ns, medians of the rep-by-rep differences")
    print(f"  {'op':<8}{'plain':>9}{'records':>10}{'sites':>8}{'full':>8}{'full/plain':>12}")
    for op in OPS:
        plain = statistics.median(r[op] for r in runs["plain"])
        rec, full = added("records", "plain", op), added("full", "plain", op)
        print(f"  {op:<8}{plain:9.0f}{rec:+10.0f}{full - rec:+8.0f}{full:+8.0f}"
              f"{(plain + full) / plain:12.3f}")
    print("  records: op records alone (sites off); sites: the state changes' records on top; "
          "full: both")


if __name__ == "__main__":
    main()
