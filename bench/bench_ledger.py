"""What the cache's ledger costs a request, native against Python, on one cache (issue 17).

One cache on ``bench_scale.py``'s workload (long multi-turn chat, ~1-3 k-token requests, page
size 1) with a ``TelemetryRecorder`` that has no drain thread behind it (its buffer dropped
between batches). Batches alternate four ways (six with ``--steps``) on that same cache, so
its heap, tree and pools are the same for all of them (separate caches differ by their layout
in memory by a few us):

- ``off``: recording off (the ledger's plain path);
- ``on``: recording on, on the native ledger (``cache/_ledger.c``), its records direct (each
  mutation encoded as it is made, the record handed to the sink in one C call: ``cache/_direct.h``);
- ``on, direct off``: the same with ``direct = False`` (tuples made and encoded by the sink);
- ``on, py ledger``: recording on, on ``cache.ledger.PyLedger`` (the same counters carried over).

With ``--steps``, two more on the same cache split ``on`` into its parts:

- ``on, dropped``: recording on, into a recorder that drops every record (the cache's side
  alone: the ledger, the attribute builders, the state changes; no encode);
- ``on, dropped, no attrs``: the same with every attribute builder returning ``()``: what is
  left of telemetry's cost with no attributes at all.

Printed: per-op medians (CPU time of the calling thread, us), the request (match + insert + lock
+ unlock), ops/s as ``bench_scale.py`` counts it (match, insert and evict, best batch) and its
ratio to ``off``'s: the cache's side of telemetry plus the recorder's encode, without the
pipeline.

    python bench/bench_ledger.py --scale 1k
    python bench/bench_ledger.py --scale 1k --steps --requests 400 --reps 12
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_record_cost import DiscardRecorder  # noqa: E402
from scale_run import Run, workload_args  # noqa: E402
from scale_workload import SCALES  # noqa: E402

from radixscope.cache import ledger, recording  # noqa: E402
from radixscope.cache.op_attrs import OP_ATTRS  # noqa: E402
from radixscope.telemetry.record.drops import Health  # noqa: E402
from radixscope.telemetry.record.recorder import TelemetryRecorder  # noqa: E402

OPS = ("match", "insert", "evict", "lock", "unlock", "alloc", "request")


def _no_attrs(cache, out, args) -> tuple:
    return ()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap, requests=500)
    ap.add_argument("--steps", action="store_true",
                    help="also the cache's side alone, with and without attribute builders")
    args = ap.parse_args()
    if ledger.LEDGER != "native":
        sys.exit("the native ledger is not built (`pip install -e .`): nothing to compare")
    torch.set_num_threads(1)
    nodes, comps = SCALES[args.scale], tuple(args.components.split(","))
    rec = TelemetryRecorder(Health(), queue_capacity=1 << 62, encode_batch=1 << 62)
    with tempfile.TemporaryDirectory(prefix="bench_ledger_") as d:
        run = Run("ledger", nodes, comps, False, d, False, rec)  # filled, buffer dropped
    c = run.c
    native = c._ledger
    python = ledger.PyLedger(c, rec.record, recording._CONTEXT, OP_ATTRS, True)

    def use(led, on: bool) -> None:
        led.seq, led.op_id, led.cur_op = c.seq, c._ledger.op_id, c._ledger.cur_op
        c.use_ledger(led)
        c._on = led.on = on

    listed = ledger.Ledger(c, rec.record, recording._CONTEXT, OP_ATTRS, True)
    listed.direct = False
    assert native.direct and not listed.direct
    runs = [("off", native, False), ("on", native, True), ("on, direct off", listed, True),
            ("on, py ledger", python, True)]
    if args.steps:
        ctx, drop = recording._CONTEXT, DiscardRecorder().record
        runs += [("on, dropped", ledger.Ledger(c, drop, ctx, OP_ATTRS, True), True),
                 ("on, dropped, no attrs",
                  ledger.Ledger(c, drop, ctx, dict.fromkeys(OP_ATTRS, _no_attrs), True), True)]
    batches: dict[str, list[dict]] = {label: [] for label, _, _ in runs}
    for _ in range(args.reps):
        for label, led, on in runs:
            use(led, on)
            run.batch(args.requests)  # its buffer dropped after, outside the timing
            batches[label].append(run.batches[-1])
    use(native, True)
    c.check()
    sums = {label: run.summary(b) for label, b in batches.items()}
    print(f"scale {args.scale}: components {'+'.join(comps)}, one cache, {args.reps} x {len(runs)} "
          f"alternating batches of {args.requests} requests; medians of the calling thread's "
          "CPU time, us")
    print(f"  {'':>22}" + "".join(f"{op:>9}" for op in OPS) + "    ops/s  of off's")
    for label, s in sums.items():
        med = [s[op][0] if op in s else float("nan") for op in OPS]
        print(f"  {label:>22}" + "".join(f"{v:9.2f}" for v in med)
              + f"  {s['ops_s']:7.0f}  {s['ops_s'] / sums['off']['ops_s']:8.3f}")


if __name__ == "__main__":
    main()
