"""Where ``tel.close()`` spends its time, faster than ``bench_scale.py --scale 100k``.

Fills one cache with full telemetry (``scale_run.Run``: the same chat workload, writer
process, store, spans) to ``--nodes`` resident nodes, runs ``--requests`` requests, then times
separately: the writer's backlog (``tel.flush()``; skipped with ``--no-flush``, so close
includes it as in ``bench_scale.py``), the close request's acknowledgement, the wait for the
writer process to exit, and ``tel.close()`` in all. Checks the store replays to the cache.

    python bench/bench_close.py --nodes 30000 --requests 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_run  # noqa: E402

from radixscope.telemetry.sinks import transport  # noqa: E402


def _timed(label: str, fn, out: dict):
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            out[label] = out.get(label, 0.0) + time.perf_counter() - t0
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=30_000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--no-flush", action="store_true", help="close without a flush first")
    args = ap.parse_args()
    torch.set_num_threads(1)
    times: dict[str, float] = {}
    pt = transport.ProcessTransport
    pt._request = _timed("ack", pt._request, times)
    with tempfile.TemporaryDirectory(prefix="bench_close_") as d:
        t0 = time.perf_counter()
        r = scale_run.Run("telemetry", args.nodes, ("full",), True, d, False)
        print(f"fill: {r.fill_requests} requests, {len(r.c.tree.nodes) - 1} nodes, "
              f"{time.perf_counter() - t0:.1f} s")
        r.batch(args.requests, quiesce=False)  # the backlog is what is timed below
        if not args.no_flush:
            t0 = time.perf_counter()
            r.tel.flush()
            print(f"flush (backlog): {time.perf_counter() - t0:.2f} s")
        times.clear()
        proc = r.tel.pipeline.transport.process
        proc.wait = _timed("exit", proc.wait, times)  # type: ignore[method-assign]
        t0 = time.perf_counter()
        r.tel.close()
        took = time.perf_counter() - t0
        print(f"close: {took:.2f} s (close acknowledged after {times.get('ack', 0):.3f} s, "
              f"writer exit waited {times.get('exit', 0):.3f} s), exit code {proc.returncode}")
        with r.tel.open_store() as rd:
            ok = rd.state_at(rd.last_seq()) == r.c.snapshot()
            print(f"store: {os.path.getsize(r.store) / 1e6:.0f} MB, state_at(last_seq) == "
                  f"snapshot: {ok}, {rd.run_status()['state']}")


if __name__ == "__main__":
    main()
