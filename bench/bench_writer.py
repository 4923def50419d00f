"""The telemetry writer's cost per op (issue 17): drain throughput and ``close()`` after a backlog.

Two measurements on ``bench_scale``'s chat workload (FULL, page 1, ~1 k or ~100 k nodes):

- ``drain``: the cache records into a ``TelemetryRecorder`` with no drain thread; the encoded
  blobs of ``--requests`` requests are then handed, in this process, to the writer's own
  ``Fanout`` (spans, metrics and the store, built as the writer process builds them) after the
  fill's blobs. Printed: ops per second of CPU (what the writer process can absorb) and, with
  ``--profile``, the top functions.
- ``close``: full process-mode telemetry (``telemetry.setup(store=...)``) fills the cache; the
  writer process is then stopped (SIGSTOP) while ``--requests`` requests run, so they wait as
  a backlog; it is resumed and ``tel.close()`` is timed (wall clock): the backlog's drain.
  ``--busy``: meanwhile a busy process shares the writer's CPU (the writer runs niced; while
  ``close()`` waits it runs at the host's priority, ``--no-prioritize`` keeps it niced).

    python bench/bench_writer.py --scale 1k --requests 3000
    python bench/bench_writer.py --scale 100k --requests 4000 --what drain --profile
    python bench/bench_writer.py --what close --busy [--no-prioritize]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_workload as bs  # noqa: E402
import torch  # noqa: E402

from radixscope.telemetry.options import TelemetryOptions  # noqa: E402
from radixscope.telemetry.record.drops import Health  # noqa: E402
from radixscope.telemetry.record.recorder import TelemetryRecorder  # noqa: E402
from radixscope.telemetry.setup import _backend_spec, _sink_specs, setup  # noqa: E402
from radixscope.telemetry.sinks import otel_exporters  # noqa: E402
from radixscope.telemetry.sinks.writer_process import _GC_THRESHOLD, WriterSpec, build_sink  # noqa: E402
from radixscope.telemetry.store.schema import create_store  # noqa: E402


def filled(nodes: int, recorder) -> tuple:
    c = bs.make_cache(nodes, ("full",), recorder)
    chat = bs.Chat(active=max(16, nodes // 12))
    bs.fill(c, chat, nodes)
    return c, chat


def drain(nodes: int, requests: int, tmp: Path, profile: bool) -> None:
    rec = TelemetryRecorder(Health(), queue_capacity=1 << 30, encode_batch=4096)
    c, chat = filled(nodes, rec)
    rec.seal()
    fill = list(rec.pending)
    rec.pending.clear()
    for k in range(requests):
        bs.one_request(c, chat.next(), None, f"r{k}")
    rec.seal()
    work = list(rec.pending)
    n_ops = sum(n for n, _ in work)
    path = tmp / "drain.db"
    create_store(path, {}, overwrite=True)
    spec = _backend_spec(False, False, None, "bench")
    resource = dict(otel_exporters.resource(spec).attributes)
    specs = _sink_specs({"backends": spec}, {"backends": spec}, (), path, TelemetryOptions(),
                        resource)
    gc.set_threshold(*_GC_THRESHOLD)  # as the writer process sets it
    sink = build_sink(WriterSpec(specs), Health())
    sink.handle([("attach", rec.info, rec.initial_snapshot.to_dict())])
    for _, blob in fill:
        sink.handle([("ops", [blob])])
    prof = cProfile.Profile() if profile else None
    t0 = time.process_time()
    if prof is not None:
        prof.enable()
    for _, blob in work:
        sink.handle([("ops", [blob])])
    cpu = time.process_time() - t0
    if prof is not None:
        prof.disable()
    sink.close()
    print(f"drain: {n_ops} ops ({requests} requests) in {cpu:.2f} s of CPU: "
          f"{n_ops / cpu:.0f} ops/s, {cpu / n_ops * 1e6:.1f} us/op")
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


def close_after_backlog(nodes: int, requests: int, tmp: Path, busy: bool,
                        prioritize: bool) -> None:
    tel = setup(store=tmp / "close.db", overwrite=True)
    if not prioritize:  # the writer stays niced while close() waits (as before issue 17)
        tel.pipeline.transport.prioritize = lambda: False
    c, chat = filled(nodes, tel.recorder)
    tel.flush()
    writer = tel.pipeline.transport.process
    burner = None
    if busy:  # the writer shares one CPU with a busy process; this thread keeps another
        os.sched_setaffinity(0, {0})
        os.sched_setaffinity(writer.pid, {1})
        burner = subprocess.Popen([sys.executable, "-c", "import os\n"
                                   "os.sched_setaffinity(0, {1})\nwhile True: pass"])
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        ops0, seq0 = c.current_op_id, tel.recorder.current_seq()
        t0 = time.perf_counter()
        for k in range(requests):
            bs.one_request(c, chat.next(), None, f"r{k}")
        ran = time.perf_counter() - t0
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    t0 = time.perf_counter()
    try:
        stats = tel.close()
    finally:
        if burner is not None:
            burner.kill()
    took = time.perf_counter() - t0
    dropped = sum(stats.get("dropped", {}).values())
    print(f"close: backlog of {requests} requests ({c.current_op_id - ops0} ops, "
          f"{tel.recorder.current_seq() - seq0} mutations, made in {ran:.2f} s) drained by "
          f"close() in {took:.2f} s; dropped {dropped}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="1k", choices=sorted(bs.SCALES))
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--what", default="both", choices=("drain", "close", "both"))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--busy", action="store_true",
                    help="close: a busy process shares the writer's CPU (2 CPUs needed)")
    ap.add_argument("--no-prioritize", action="store_true",
                    help="close: keep the writer niced while close() waits")
    args = ap.parse_args()
    torch.set_num_threads(1)
    nodes = bs.SCALES[args.scale]
    with tempfile.TemporaryDirectory(prefix="bench_writer_") as d:
        if args.what in ("drain", "both"):
            drain(nodes, args.requests, Path(d), args.profile)
        if args.what in ("close", "both"):
            close_after_backlog(nodes, args.requests, Path(d), args.busy,
                                not args.no_prioritize)


if __name__ == "__main__":
    main()
