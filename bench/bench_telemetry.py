"""Chat-workload throughput with telemetry off vs fully on, measured in one process run.

"Fully on" is ``telemetry.setup(store=...)`` with its defaults: every cache op is recorded, gets
a span (ids assigned in the writer process, parented on the caller's span) and is journaled into
the SQLite store with keyframes and pool samples; the engine also records its admission
decisions. "Off" is the cache's default ``NullRecorder`` (the cache records nothing). The
engine's own request spans go to the API's no-op tracer in both (``capture_host_spans=False``),
so the ratio is the cache telemetry's cost alone.

Workloads (same seed in every run, so both sides do exactly the same cache calls):
- ``engine``: the reference engine (``engine/``) serving its multi-turn chat workload with the
  stand-in model (chunked prefill, decode, load-backs, evictions): what a serving loop sees.
- ``cache``: a bare chat loop of cache calls only (match, load_back, lock, alloc, insert, unlock,
  poll), no model: the harshest ratio, since nothing else dilutes telemetry's cost.

Each rep is a pair of runs, off then on or on then off (alternating, so a machine that speeds
up or slows down during the bench favours neither side); the headline is the median of the
per-pair ratios, with their quartiles: the machine's speed drifts by up to 3x over a minute
here, and a pair (a few seconds) sees about the same machine. Medians of each side and the
ratio of the fastest runs (best-of-N) are printed too. ``hot`` is ops/s while the
workload runs; ``e2e`` also counts ``tel.flush()``, i.e. until the store has committed every op
(the writer's backlog); ``close()`` (final WAL checkpoint, process exit) is not timed. The
machine is shared (steal time), so wall-clock numbers are noisy: the CPU lines (this process,
all threads; and the writer process) are the steadier view of what telemetry costs.

    python bench/bench_telemetry.py                       # both workloads, 5 reps
    python bench/bench_telemetry.py --workload engine --requests 300 --reps 7
    python bench/bench_telemetry.py --stages --reps 7      # where the cost goes, stage by stage
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from radixscope import telemetry
from radixscope.cache import CacheConfig, HiRadixCache
from radixscope.cache.events import Recorder


# ---- workloads -------------------------------------------------------------------------------
def engine_workload(requests: int, seed: int):
    """The engine's chat workload; returns ``prepare(recorder, tel) -> run``."""
    from radixscope.engine import workloads
    from radixscope.engine.engine import Engine
    from radixscope.engine.instrument import TimedCache
    from radixscope.engine.run import RunSpec

    spec = RunSpec(workload="chat", requests=requests, seed=seed)
    cfg = spec.cache_config()
    reqs = workloads.build("chat", requests, seed)

    def prepare(recorder, tel):
        cache = TimedCache(HiRadixCache(cfg, recorder=recorder), None)
        eng = Engine(cache, reqs, spec.engine_config(), telemetry=tel)

        def run() -> None:
            eng.run()
        return run
    return prepare


def make_cache(recorder=None) -> HiRadixCache:
    """The bare loop's cache (also used by ``bench_postmortem.py``)."""
    cfg = CacheConfig.preset("full", device_tokens=8192, host_tokens=32768)
    return HiRadixCache(cfg, recorder=recorder)


class ChatWorkload:
    """Seeded multi-turn chat of bare cache calls: ``n_system`` shared system prompts,
    ``n_conv`` conversations visited at random, each turn adding a user message and an answer.
    ``turn`` is an engine's sequence per request: match -> (load_back) -> lock -> alloc ->
    (write KV: the stand-in model, optional) -> insert -> unlock -> poll. ``ops`` counts the
    calls (also used by ``bench_postmortem.py``)."""

    def __init__(self, seed: int, n_system: int = 8, system_len: int = 256, n_conv: int = 64,
                 user_len: tuple[int, int] = (16, 64), answer_len: tuple[int, int] = (16, 96),
                 max_context: int = 1536, write_kv: bool = True) -> None:
        self.rng = random.Random(seed)
        self.systems = [[self.rng.randrange(32000) for _ in range(system_len)]
                        for _ in range(n_system)]
        self.convs = [list(self.systems[i % n_system]) for i in range(n_conv)]
        self.user_len, self.answer_len = user_len, answer_len
        self.max_context = max_context
        self.write_kv = write_kv
        self.ops = 0

    def turn(self, c: HiRadixCache, rid: str) -> None:
        rng = self.rng
        ci = rng.randrange(len(self.convs))
        conv = self.convs[ci]
        if len(conv) > self.max_context:  # the conversation ends; a new one starts
            conv = self.convs[ci] = list(self.systems[ci % len(self.systems)])
        conv.extend(rng.randrange(32000) for _ in range(rng.randint(*self.user_len)))
        prompt = list(conv)
        m = c.match_prefix(prompt, req_id=rid)
        self.ops += 1
        prefix_idx, prefix, anchor = m.device_indices, m.device_prefix_len, m.last_device_node
        if m.needs_load_back:
            lb = c.load_back(m, req_id=rid)
            self.ops += 1
            prefix_idx, prefix, anchor = lb.device_indices, lb.device_prefix_len, lb.anchor
        receipt = c.lock(anchor, owner=rid, req_id=rid)
        answer = [rng.randrange(32000) for _ in range(rng.randint(*self.answer_len))]
        full = prompt + answer
        new = c.alloc(len(full) - prefix, req_id=rid)
        if self.write_kv:
            pool = c.device_pools[0]
            b = pool.buf
            pool.write(new, torch.full((b.shape[0], 2, new.numel(), b.shape[3], b.shape[4]),
                                       float(len(full) % 97)))
        c.insert(full, torch.cat([prefix_idx, new]), prev_prefix_len=prefix, req_id=rid)
        c.unlock(receipt, req_id=rid)
        c.poll()
        self.ops += 5  # lock, alloc, insert, unlock, poll
        conv.extend(answer)


def cache_workload(turns: int, seed: int):
    """The bare loop without KV writes; returns ``prepare(recorder, tel) -> run``."""

    def prepare(recorder, tel):
        c = make_cache(recorder)
        wl = ChatWorkload(seed, write_kv=False)

        def run() -> None:
            for k in range(turns):
                wl.turn(c, f"r{k}")
        return run
    return prepare


# ---- measurement ------------------------------------------------------------------------------
SETUP: dict = {}  # extra telemetry.setup arguments (--writer-nice)
PAUSE_WRITER = [False]  # --pause-writer


def measure(prepare, on: bool, tmp: Path, tag: str) -> dict:
    """One run. Wall time (hot: the workload; e2e: until the store holds everything) and CPU
    time during the workload: the cache's thread, this process (all threads: the drain thread
    too) and the writer process (until the store holds everything)."""
    tel = None
    if on:
        tel = telemetry.setup(store=tmp / f"{tag}.db", overwrite=True, capture_host_spans=False,
                              **SETUP)
    run = prepare(tel.recorder if tel else None, tel)
    w0 = 0.0
    if tel is not None:
        tel.flush()  # the writer process is up and attached before the clock starts
        w0 = tel.pipeline.last_stats["process"]["cpu_s"]
    writer = tel.pipeline.transport.process.pid if tel is not None and PAUSE_WRITER[0] else None
    if writer is not None:
        os.kill(writer, signal.SIGSTOP)  # records wait in the queue; the store catches up later
    c0, th0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    run()
    out = {"hot_s": time.perf_counter() - t0, "thread_cpu_s": time.thread_time() - th0,
           "cpu_s": time.process_time() - c0, "writer_cpu_s": 0.0, "dropped": 0,
           "failures": 0}
    if writer is not None:
        os.kill(writer, signal.SIGCONT)
    if tel is not None:
        tel.flush(timeout_s=600)  # the store has committed every op
        out["e2e_s"] = time.perf_counter() - t0
        out["writer_cpu_s"] = tel.pipeline.last_stats["process"]["cpu_s"] - w0
        stats = tel.close(timeout_s=600)  # not timed: final checkpoint, process exit
        out["dropped"] = sum(stats["dropped"].values())
        out["failures"] = sum(stats["failures"].values())
        with telemetry.open_store(tel.store_path) as r:  # outside every measurement
            out["ops"] = len(r.ops())
        tel.store_path.unlink(missing_ok=True)
    else:
        out["e2e_s"] = out["hot_s"]
    return out


def bench(name: str, prepare, reps: int, tmp: Path) -> dict:
    off, on = [], []
    for rep in range(reps):
        for side in ((False, True) if rep % 2 == 0 else (True, False)):
            (on if side else off).append(measure(prepare, side, tmp, f"{name}-{rep}"))
    counts = {r["ops"] for r in on}
    assert len(counts) == 1, f"{name}: runs recorded different numbers of ops: {counts}"
    n = counts.pop()  # op records (transfer acks included); the same calls in the off runs
    med = statistics.median

    def per_op(rs, key):
        return med(r[key] / n * 1e6 for r in rs)

    res = {
        "ops": n,
        "off": med(n / r["hot_s"] for r in off),
        "hot": med(n / r["hot_s"] for r in on),
        "e2e": med(n / r["e2e_s"] for r in on),
        "pairs": med(a["hot_s"] / b["hot_s"] for a, b in zip(off, on, strict=True)),
        "pairs_e2e": med(a["hot_s"] / b["e2e_s"] for a, b in zip(off, on, strict=True)),
        "quartiles": statistics.quantiles(
            [a["hot_s"] / b["hot_s"] for a, b in zip(off, on, strict=True)], n=4)
        if reps > 1 else [0.0, 0.0, 0.0],
        "best": min(r["hot_s"] for r in off) / min(r["hot_s"] for r in on),
        "best_e2e": min(r["hot_s"] for r in off) / min(r["e2e_s"] for r in on),
        "thread_off": per_op(off, "thread_cpu_s"), "thread_on": per_op(on, "thread_cpu_s"),
        "proc_off": per_op(off, "cpu_s"), "proc_on": per_op(on, "cpu_s"),
        "writer": per_op(on, "writer_cpu_s"),
        "dropped": sum(r["dropped"] for r in on),
        "failures": sum(r["failures"] for r in on),
    }
    print(f"[{name}] {n} op records per run, {reps} pairs (off/on, then on/off, ...)")
    for a, b in zip(off, on, strict=True):
        print(f"    off {n / a['hot_s']:8.0f} ops/s | on {n / b['hot_s']:8.0f} ops/s hot "
              f"{n / b['e2e_s']:8.0f} e2e | ratio {a['hot_s'] / b['hot_s']:.3f} | "
              f"dropped {b['dropped']} failures {b['failures']}")
    q1, _, q3 = res["quartiles"]
    print(f"  RATIO on/off (median of per-pair ratios)  hot {res['pairs']:.3f} "
          f"(quartiles {q1:.3f}-{q3:.3f})   e2e {res['pairs_e2e']:.3f}")
    print(f"  ops/s (median)  off {res['off']:.0f}   on {res['hot']:.0f} hot   "
          f"{res['e2e']:.0f} e2e   (ratio of medians: hot {res['hot'] / res['off']:.3f}, "
          f"e2e {res['e2e'] / res['off']:.3f})")
    print(f"  best-of-{reps} ratio (fastest on / fastest off: the runs least disturbed by the "
          f"machine)  hot {res['best']:.3f}   e2e {res['best_e2e']:.3f}")
    print(f"  CPU us/op       cache thread {res['thread_off']:.1f} -> {res['thread_on']:.1f}   "
          f"this process {res['proc_off']:.1f} -> {res['proc_on']:.1f}   "
          f"writer process {res['writer']:.1f}")
    print(f"  every op stored: dropped {res['dropped']}, failures {res['failures']}")
    return res


class _DropRecorder(Recorder):
    """Takes every record and keeps nothing: what the cache's own recording costs."""

    enabled = True
    capture_context = True

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        pass


class NullTransport:
    """A transport that discards what the drain thread ships: what the drain thread costs."""

    def send(self, messages: list[tuple]) -> None:
        pass

    def flush(self, timeout_s: float) -> dict:
        return {}

    def close(self, timeout_s: float) -> dict:
        return {}


STAGES = ("off", "record", "encode", "drain", "full")


def stages(name: str, prepare, reps: int, tmp: Path) -> None:
    """Where the cost goes: each stage adds one part of the pipeline. ``record``: the cache
    builds its records for a recorder that drops them; ``encode``: the real recorder encodes
    and queues them (nothing drains); ``drain``: plus the drain thread, shipping to nowhere;
    ``full``: ``telemetry.setup`` (plus the writer process). Each rep runs every stage once,
    in an order rotated by one each rep (a run right after another one is measurably slower
    here, so a fixed order would favour the first stage); the cache thread's CPU time and wall
    time per stage, best and median of ``reps``."""
    from radixscope.telemetry.record.drain import Pipeline
    from radixscope.telemetry.record.drops import Health
    from radixscope.telemetry.record.recorder import TelemetryRecorder

    res: dict[str, list[tuple[float, float]]] = {s: [] for s in STAGES}
    for rep in range(reps):
        k = rep % len(STAGES)
        for stage in STAGES[k:] + STAGES[:k]:
            tel = pipe = None
            rec = None
            if stage == "record":
                rec = _DropRecorder()
            elif stage in ("encode", "drain"):
                health = Health()
                rec = TelemetryRecorder(health, queue_capacity=1 << 30)
                if stage == "drain":
                    pipe = Pipeline(rec, NullTransport(), health)
            elif stage == "full":
                tel = telemetry.setup(store=tmp / f"{name}-stages-{rep}.db", overwrite=True,
                                      capture_host_spans=False, **SETUP)
                rec = tel.recorder
            run = prepare(rec, tel)
            if tel is not None:
                tel.flush()
            th0, t0 = time.thread_time(), time.perf_counter()
            run()
            res[stage].append((time.thread_time() - th0, time.perf_counter() - t0))
            if pipe is not None:
                pipe.close()
            if tel is not None:
                tel.close(timeout_s=600)
                tel.store_path.unlink(missing_ok=True)
    med = statistics.median
    base_th = min(r[0] for r in res["off"])
    base_wall = min(r[1] for r in res["off"])
    print(f"[{name}] stages, {reps} reps; cache thread CPU and wall time relative to off "
          "(best-of / median)")
    for stage in STAGES:
        th = [r[0] for r in res[stage]]
        wall = [r[1] for r in res[stage]]
        print(f"  {stage:7s} thread {min(th) / base_th:.3f} / {med(th) / med(r[0] for r in res['off']):.3f}"
              f"   wall {min(wall) / base_wall:.3f} / {med(wall) / med(r[1] for r in res['off']):.3f}")


def once(on: bool, requests: int, seed: int) -> None:
    """One engine run, for instruction counts: ``valgrind --tool=callgrind --trace-children=yes
    python bench/bench_telemetry.py --once on --requests N`` at two sizes; the difference per
    op is the cost per op, in the cache's process and (a separate file) the writer process."""
    with tempfile.TemporaryDirectory() as d:
        tel = None
        if on:
            tel = telemetry.setup(store=Path(d) / "once.db", capture_host_spans=False)
        run = engine_workload(requests, seed)(tel.recorder if tel else None, tel)
        if tel is not None:
            tel.flush()
        run()
        if tel is not None:
            tel.close()
            print(f"op records: {tel.pipeline.shipped}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=("engine", "cache", "both"), default="both")
    ap.add_argument("--requests", type=int, default=200, help="engine chat requests per run")
    ap.add_argument("--turns", type=int, default=1500, help="bare-loop turns per run")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--writer-nice", type=int, default=None,
                    help="telemetry.setup(writer_nice=...) (default: setup's default)")
    ap.add_argument("--pause-writer", action="store_true",
                    help="stop the writer process while the workload runs (SIGSTOP; it catches "
                         "up before the e2e clock stops): what telemetry costs when the writer "
                         "has a core to itself, which this 2-vCPU box cannot give it")
    ap.add_argument("--stages", action="store_true",
                    help="break the cost down by pipeline stage instead of off vs on")
    ap.add_argument("--once", choices=("off", "on"),
                    help="one untimed engine run (to count instructions under valgrind)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.writer_nice is not None:
        SETUP["writer_nice"] = args.writer_nice
    PAUSE_WRITER[0] = args.pause_writer
    if args.once:
        once(args.once == "on", args.requests, args.seed)
        return
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run = stages if args.stages else bench
        if args.workload in ("engine", "both"):
            run("engine chat", engine_workload(args.requests, args.seed), args.reps, tmp)
        if args.workload in ("cache", "both"):
            run("bare cache loop", cache_workload(args.turns, args.seed), args.reps, tmp)


if __name__ == "__main__":
    main()
