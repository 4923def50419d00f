"""One cache on ``bench_scale.py``'s workload, filled to its resident size, run in timed batches
(``Run``), and the workload's command-line options: what ``bench_scale.py``,
``bench_ledger.py``, ``bench_record_cost.py`` and ``bench_close.py`` build on."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_workload  # noqa: E402
from scale_probes import (  # noqa: E402
    CURRENT,
    GC_PAUSES,
    Floor,
    floor_of,
    rss,
    stop_process,
    thread_faults,
)
from scale_stats import NOT_OPS, OPS, by_depth, ops_in, timed_ops_s  # noqa: E402
from scale_workload import (  # noqa: E402
    CLOCK,
    SCALES,
    Chat,
    fill,
    kv_bytes,
    make_cache,
    one_request,
)

DISCARD_EVERY = 1000  # fill requests between drops of a detached recorder's buffer
HELD_BATCH = 1 << 40  # a held recorder's encode_batch: it never wakes the drain thread
HELD_INTERVAL_S = 3600.0  # a held drain thread's period
FLOOR = Floor()  # the machine's own tail (``Run.summary``'s "floor"), timed by a floor run


class Run:
    """One cache (baseline or full telemetry), filled to its resident size."""

    def __init__(self, label: str, nodes: int, comps: tuple[str, ...], telemetry_on: bool,
                 store_dir: str, freeze: bool, recorder=None, floor: bool = False) -> None:
        """``recorder`` (with ``telemetry_on`` False): a recorder of the caller's with no
        pipeline behind it (``bench_record_cost.py``); what it buffers is discarded between
        batches and every ``DISCARD_EVERY`` fill requests, outside every timing. ``floor``: a
        run of its own, with no recorder, that times the machine's floor between its requests
        (``Floor``; its summary's "floor"). Only such a run: the fixed work slows the ops of the
        cache it runs beside by a few percent (on one machine, a cache with it against one
        without read -4.3 % over eight runs, two caches with it 0.0 %), and with telemetry its
        pipeline would work on through time the batch does not count. Its collections are not
        counted in ``GC_PAUSES`` (no one's batch)."""
        if floor and (telemetry_on or recorder is not None):
            raise ValueError("a floor run has no recorder")
        self.label = label
        self.tel = None
        self.store = None
        self.detached = recorder
        self.times_floor = floor
        gc.collect()
        rss0 = rss()
        tracked0 = len(gc.get_objects())
        if telemetry_on:
            from radixscope import telemetry
            self.store = os.path.join(store_dir, f"{label}.db")
            self.tel = telemetry.setup(store=self.store, overwrite=True)
            recorder = self.tel.recorder
        self.c = make_cache(nodes, comps, recorder)
        self.chat = Chat(active=max(16, nodes // 12))
        t0 = time.perf_counter()
        c = self.c
        self.ops = 0

        def each(i: int, calls: int) -> None:
            self.ops += calls
            if (i + 1) % DISCARD_EVERY == 0:
                self.discard()

        i = fill(c, self.chat, nodes, each)
        for _ in range(max(200, nodes // 20)):  # settle into steady-state eviction
            self.ops += one_request(c, self.chat.next(), None, f"w{i}")
            i += 1
        self.discard()
        self.quiesce()
        self._writer_faults = self.writer_faults()
        self.fill_s = time.perf_counter() - t0
        self.fill_requests = i
        gc.collect()
        resident = c.config.device_tokens - c.available()
        self.mem_per_token = (rss() - rss0 - kv_bytes(c) - self.chat.nbytes()) / resident
        # objects the collector tracks, added by this cache (the workload's arrays left out)
        tracked = len(gc.get_objects()) - tracked0 - len(self.chat.convs) - len(self.chat.prompts)
        self.tracked_per_node = tracked / (len(c.tree.nodes) - 1)
        self.resident = resident
        if freeze:
            gc.freeze()
        self.batches: list[dict] = []
        self.store_bytes = 0

    def discard(self) -> None:
        """Drop what a detached ``TelemetryRecorder`` buffered (its drain thread's part, without
        shipping it anywhere)."""
        rec = self.detached
        if hasattr(rec, "take"):
            rec.seal()
            rec.take(1 << 62)

    def quiesce(self) -> None:
        """Wait, outside every timing, until the telemetry pipeline (if any) has shipped and
        stored what this cache recorded: its drain thread and writer process then do not run on
        into the next cache's batch and get charged to that cache. They did before: full
        telemetry's cost at 1 k nodes read 5.3 % on average over four runs of 12 batch pairs
        without this wait, 6.9 % over seven with it (RESULTS.md, #17, twenty-fourth round).
        Telemetry's own batches still run with the pipeline shipping their records meanwhile,
        as a serving process does."""
        if self.tel is not None:
            self.tel.flush()

    def hold(self, held: bool) -> None:
        """Hold this cache's telemetry pipeline (``--split``), or release it: held, the recorder
        never wakes the drain thread and the thread's period is past any batch, so a batch's
        records wait in the recorder (its queue holds 262,144) and ship at the next
        ``quiesce``. Returns once the drain thread has run the cycle that picks the period up,
        so none runs during the batch."""
        if self.tel is None:
            return
        rec, pipe = self.tel.recorder, self.tel.pipeline
        if not hasattr(self, "_shipping"):
            self._shipping = (rec.encode_batch, pipe.interval_s)
        rec.encode_batch, pipe.interval_s = ((HELD_BATCH, HELD_INTERVAL_S) if held
                                             else self._shipping)
        cycles = pipe.cycles
        rec.wake.set()
        deadline = time.monotonic() + 5.0
        while pipe.cycles == cycles and time.monotonic() < deadline:
            time.sleep(0.0005)

    def store_size(self) -> int:
        if self.tel is None:
            return 0
        con = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True)
        try:
            return int(con.execute("PRAGMA page_count").fetchone()[0]) * \
                int(con.execute("PRAGMA page_size").fetchone()[0])
        finally:
            con.close()

    def batch(self, requests: int, quiesce: bool = True, pause_writer: bool = False) -> None:
        """One timed batch of ``requests``; then, with ``quiesce``, the pipeline waited for
        (the last batch leaves its backlog to ``close()``, which is timed). ``pause_writer``:
        the writer process is stopped (SIGSTOP) while the batch runs and resumed after, so the
        batch pays for the cache's thread alone (the drain thread blocks once the pipe is
        full): what telemetry costs less what its writer's work on the machine costs. A quiesced
        batch of a cache with telemetry also counts the writer's page faults during it
        (``writer_faults``)."""
        writer = self.tel.pipeline.transport.process if pause_writer and self.tel else None
        if writer is not None:
            stop_process(writer.pid)
        try:
            self._timed_batch(requests)
        finally:
            if writer is not None:
                os.kill(writer.pid, signal.SIGCONT)
        if not quiesce:  # its faults land in no batch's count: the next one starts afresh
            self._writer_faults = None
            return
        self.quiesce()
        faults = self.writer_faults()
        if faults is not None and self._writer_faults is not None:
            self.batches[-1]["writer_faults"] = faults - self._writer_faults
        self._writer_faults = faults

    def writer_faults(self) -> int | None:
        """The writer process's minor page faults so far, as its last flush reported them; None
        without a writer."""
        if self.tel is None:
            return None
        return (self.tel.pipeline.last_stats or {}).get("process", {}).get("minor_faults")

    def _timed_batch(self, requests: int) -> None:
        c = self.c
        keys = [self.chat.next() for _ in range(requests)]  # workload generation is not timed
        t = {k: [] for k in (*OPS, *NOT_OPS)}
        floor = t["floor"] if self.times_floor else None
        aside = t["aside"]
        ops = 0
        # Every batch starts with the young generations empty, so the collections in it are
        # the ones its own cache's allocations trigger. The collector is the process's: left
        # alone, its counts carry over from the other cache's batch, and with a deterministic
        # workload its generation-1 collections (4-7 ms at 100 k nodes) fell on the same
        # cache's batches every time (the baseline's every other batch at 100 k), which read
        # as telemetry costing about 10 points less in those pairs.
        gc.collect(1)
        CURRENT[0] = self.label
        GC_PAUSES.on = not self.times_floor
        faults0 = thread_faults()
        cpu0 = CLOCK()
        for k, key in enumerate(keys):
            ops += one_request(c, key, t, f"r{k}")
            if floor is not None:  # the machine's floor: left out of the batch's CPU time
                f0 = CLOCK()
                FLOOR.between(k, CLOCK, floor)
                aside.append(CLOCK() - f0)
        cpu = (CLOCK() - cpu0 - sum(aside)) / 1e9
        faults1 = thread_faults()
        GC_PAUSES.on = False
        t["faults"] = None if faults0 is None or faults1 is None else faults1 - faults0
        CURRENT[0] = ""
        self.discard()
        self.ops += ops
        t["cpu"] = cpu
        t["n"] = requests
        self.batches.append(t)

    def close(self) -> float:
        if self.tel is None:
            return 0.0
        t0 = time.perf_counter()
        self.tel.close()
        took = time.perf_counter() - t0
        self.store_bytes = self.store_size()
        return took

    def summary(self, batches: list[dict] | None = None) -> dict:
        """Pooled over ``batches`` (default: all of this run's): medians / p99 per op; req/s
        from the best batch (least noise)."""
        batches = self.batches if batches is None else batches
        out: dict = {}
        for op in (*ops_in(batches), "request"):
            v = sorted(x for b in batches for x in b.get(op, ()))
            if v:
                out[op] = (statistics.median(v) / 1e3, v[int(len(v) * 0.99)] / 1e3)
        best = min(batches, key=lambda b: b["cpu"] / b["n"])
        out["req_s"] = best["n"] / best["cpu"]
        out["ops_s"] = timed_ops_s(best)
        out["hit"] = statistics.mean(x for b in batches for x in b["hit"])
        # FULL evict calls by the nodes they removed (evicted + tombstone ancestors deleted):
        # the call's cost follows them, so its tail is the workload's spread of victims
        calls = [(v, ns) for b in batches
                 for v, ns in zip(b.get("victims", ()), b.get("evict", ()), strict=True)]
        if calls:
            vs = sorted(v for v, _ in calls)
            per = sorted(ns / v for v, ns in calls if v)  # (a call that removed none: skipped)
            out["victims"] = (statistics.median(vs), vs[int(len(vs) * 0.99)])
            for key in ("asked", "ancestors"):  # tokens asked for; tombstone ancestors deleted
                v = sorted(x for b in batches for x in b[key])
                out[key] = (statistics.median(v), v[int(len(v) * 0.99)])
            out["per_victim"] = ((statistics.median(per) / 1e3, per[int(len(per) * 0.99)] / 1e3)
                                 if per else (0.0, 0.0))
        out["by_depth"] = by_depth([(d, ns) for b in batches
                                     for d, ns in zip(b["depth"], b["match"], strict=True)])
        out["nodes"] = len(self.c.tree.nodes) - 1
        out["floor"] = floor_of([x for b in batches for x in b.get("floor", ())])
        return out


def workload_args(ap: argparse.ArgumentParser, requests: int) -> None:
    """The options of the workload and its batches (this bench's and ``bench_record_cost``'s)."""
    ap.add_argument("--scale", default="1k", choices=sorted(SCALES))
    ap.add_argument("--requests", type=int, default=requests, help="requests per batch")
    ap.add_argument("--reps", type=int, default=3, help="interleaved batches per cache")
    ap.add_argument("--components", default="full", help="e.g. full,swa or full,swa,mamba")
    ap.add_argument("--no-branching", action="store_true",
                    help="requests ignore MatchResult.branch_len (no branching points)")


def parse_workload(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse the command line; ``--no-branching`` applies to every request made after."""
    args = ap.parse_args()
    scale_workload.BRANCHING = not args.no_branching
    return args
