"""Where full telemetry's cost on the hot path goes (issue 17), in one process.

Six to nine caches on ``bench_scale.py``'s workload (long multi-turn chat, ~1-3 k-token requests,
page size 1), interleaved batch by batch, each a step further along the record path:

- ``baseline``: no recorder;
- ``cache side``: a recorder that takes each op and drops it: what the cache itself does to
  record (the ledger's ids, clock and caller context, the attribute tuple, one tuple per state
  change);
- ``recorder``: a ``TelemetryRecorder`` with no drain thread behind it (its buffer dropped
  between batches): the recorder's call on top (the caller's span ids, the record encoded into
  its buffer), on the encoder in use (``telemetry.record.sink.ENCODER``);
- ``recorder (py)``, where the native encoder is built: the same on the Python encoder (one
  ``marshal.dumps`` and one append per record), for comparison;
- ``baseline (py)`` and ``cache side (py)``, where the native ledger is built: the first two on
  the Python ledger (``cache.ledger.PyLedger``), for comparison;
- ``drain``: a ``TelemetryRecorder`` with its drain thread (``telemetry.record.drain.Pipeline``)
  shipping to a transport that drops what it is sent: the drain thread's work in the cache's
  process, with no writer process beside it;
- ``pipe``: the same, shipping the messages down a pipe as the writer's transport frames them
  (``writer_process.send_message``) to ``cat`` writing to ``/dev/null``: the pipe's cost (the
  kernel's copies on both ends) without the writer's work;
- ``telemetry``: ``telemetry.setup`` as a user runs it (drain thread, writer process, store).

Printed: each cache's per-op medians (CPU time of the calling thread, us) and ops/s (as
``bench_scale.py`` counts them: match, insert and evict, best batch) with its ratio to the
baseline's and its cost in ops/s as ``bench_scale.py`` judges telemetry's (the median of the batch
pairs), then each step's
added cost per op and per request (match + insert + lock + unlock, as issue 17 counts it), and
each step's share of the baseline's request. The steps are differences of medians on a noisy
machine: read them to about a microsecond.

    python bench/bench_record_cost.py --scale 1k
    python bench/bench_record_cost.py --scale 100k --requests 1000 --reps 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_telemetry import NullTransport  # noqa: E402
from scale_run import Run, parse_workload, workload_args  # noqa: E402
from scale_stats import ops_in, paired_costs  # noqa: E402
from scale_workload import SCALES  # noqa: E402

from radixscope.cache import native, recording  # noqa: E402
from radixscope.cache.events import Recorder  # noqa: E402
from radixscope.cache.ledger import LEDGER, PyLedger  # noqa: E402
from radixscope.telemetry.record.drain import Pipeline  # noqa: E402
from radixscope.telemetry.record.drops import Health  # noqa: E402
from radixscope.telemetry.record.recorder import TelemetryRecorder  # noqa: E402
from radixscope.telemetry.record.sink import ENCODER  # noqa: E402
from radixscope.telemetry.sinks.transport import _grow_pipe  # noqa: E402
from radixscope.telemetry.sinks.writer_process import send_message  # noqa: E402

STEPS = (("cache side", "baseline", "discard"), ("recorder", "discard", "recorder"),
         ("recorder (py)", "discard", "recorder_py"), ("drain thread", "recorder", "drain"),
         ("pipe", "drain", "pipe"), ("writer", "pipe", "telemetry"),
         ("pipeline", "recorder", "telemetry"),
         ("py ledger, off", "baseline", "baseline_py"),
         ("py ledger, on", "discard", "discard_py"))


class DiscardRecorder(Recorder):
    """Enabled, captures the caller's context, keeps nothing: the cache's own share."""

    enabled = True
    capture_context = True

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        pass


class CatTransport:
    """The writer's transport without the writer: each message batch framed as
    ``ProcessTransport`` frames it, down a pipe grown as it grows its own, to ``command``
    (``cat`` writing to ``/dev/null``). ``blob_bytes``: the op blobs' bytes sent."""

    def __init__(self, command: tuple[str, ...] = ("cat",), stdout=subprocess.DEVNULL) -> None:
        self.blob_bytes = 0
        read, write = os.pipe()
        _grow_pipe(write)
        try:
            self.process = subprocess.Popen(list(command), stdin=read, stdout=stdout)
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        self._out = Connection(write, readable=False)

    def send(self, messages: list[tuple]) -> None:
        send_message(self._out, messages)
        self.blob_bytes += sum(len(b) for m in messages if m[0] == "ops" for b in m[1])

    def flush(self, timeout_s: float) -> dict:
        return {}

    def close(self, timeout_s: float) -> dict:
        self._out.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return {}


class DrainRun(Run):
    """A cache whose ``TelemetryRecorder`` is drained by its own thread into ``transport``
    (default ``NullTransport``): the pipeline in the cache's process, without the writer
    process. Waited for as ``telemetry`` is (``quiesce``: the drain run at once)."""

    def __init__(self, label: str, nodes: int, comps: tuple[str, ...], store_dir: str,
                 transport=None) -> None:
        health = Health()
        recorder = TelemetryRecorder(health)
        self.pipeline = Pipeline(recorder, transport or NullTransport(), health)
        super().__init__(label, nodes, comps, False, store_dir, False, recorder)

    def discard(self) -> None:
        pass  # the drain thread takes what is recorded

    def quiesce(self) -> None:
        self.pipeline.flush()

    def close(self) -> float:
        self.pipeline.close()
        return 0.0


@contextlib.contextmanager
def python_ledger():
    """Caches made inside run on the Python ledger."""
    built, recording.Ledger = recording.Ledger, PyLedger
    try:
        yield
    finally:
        recording.Ledger = built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap, requests=1000)
    args = parse_workload(ap)
    nodes, comps = SCALES[args.scale], tuple(args.components.split(","))
    torch.set_num_threads(1)
    def detached(encoder: str) -> TelemetryRecorder:
        return TelemetryRecorder(Health(), queue_capacity=1 << 62, encode_batch=1 << 62,
                                 encoder=encoder)

    with tempfile.TemporaryDirectory(prefix="bench_record_cost_") as d:
        runs = {"baseline": Run("baseline", nodes, comps, False, d, False),
                "discard": Run("cache side", nodes, comps, False, d, False, DiscardRecorder()),
                "recorder": Run("recorder", nodes, comps, False, d, False, detached(ENCODER))}
        if ENCODER == "native":
            runs["recorder_py"] = Run("recorder (py)", nodes, comps, False, d, False,
                                      detached("python"))
        if LEDGER == "native":
            with python_ledger():
                runs["baseline_py"] = Run("baseline (py)", nodes, comps, False, d, False)
                runs["discard_py"] = Run("cache side (py)", nodes, comps, False, d, False,
                                         DiscardRecorder())
        runs["drain"] = DrainRun("drain", nodes, comps, d)
        runs["pipe"] = DrainRun("pipe", nodes, comps, d, CatTransport())
        runs["telemetry"] = Run("telemetry", nodes, comps, True, d, False)
        for i in range(args.reps):
            for r in runs.values():
                r.batch(args.requests, quiesce=i < args.reps - 1)
        for r in runs.values():
            r.c.check()
            r.close()
        sums = {k: r.summary() for k, r in runs.items()}
    ops = [op for op in ops_in(runs["baseline"].batches) if all(op in v for v in sums.values())]
    cols = (*ops, "request")
    w = [max(8, len(c)) for c in cols]

    def line(label: str, values) -> str:
        return f"  {label:>13} " + " ".join(f"{v:{n}.1f}" for v, n in zip(values, w, strict=True))

    print(f"scale {args.scale}: components {'+'.join(comps)}, {args.reps} interleaved batches x "
          f"{args.requests} requests per cache; medians of the calling thread's CPU time, us; "
          f"kernels {native.KERNELS}, ledger {LEDGER}, encoder {ENCODER}")
    print(f"  {'':>13} " + " ".join(f"{c:>{n}}" for c, n in zip(cols, w, strict=True))
          + "    ops/s  of baseline's  cost (pairs)")
    for k, r in runs.items():
        ops_s = sums[k]["ops_s"]
        pairs = statistics.median(paired_costs(runs["baseline"].batches, r.batches))
        print(line(r.label, [sums[k][c][0] for c in cols])
              + f"  {ops_s:7.0f}  {ops_s / sums['baseline']['ops_s']:13.3f}  {pairs:10.1%}")
    base = sums["baseline"]["request"][0]
    print("  added by each step (us), and its share of the baseline's request:")
    for name, a, b in STEPS:
        if b not in sums:
            continue
        added = [sums[b][c][0] - sums[a][c][0] for c in cols]
        print(line(name, added) + f"   {added[-1] / base * 100:5.1f} %")
    total = sums["telemetry"]["request"][0] - base
    pad = sum(n + 1 for n in w[:-1])
    print(f"  {'in all':>13} {'':>{pad}}{total:{w[-1]}.1f}   {total / base * 100:5.1f} %")


if __name__ == "__main__":
    main()
