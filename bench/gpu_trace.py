"""A torch profiler trace of the engine's default run on CUDA, with the cache's own telemetry
lined up in it, and whether the side stream's copies overlap compute.

    python bench/gpu_trace.py --out DIR [--requests N] [--model 8b]

``--model 8b`` runs the same workload on FULL attention at a real model's shape (32 layers x 8
KV heads x 128 head dim, bf16: 128 KiB a token; 8 k device and 32 k host tokens, so requests
are evicted and loaded back) instead of the default preset's small one. ``--forward N`` adds a
stand-in forward pass after every engine step: N bf16 8192 x 8192 x 8192 products on the
compute stream (1.1 TFLOP each; N = 4 is about an 8B model's forward over 275 tokens), queued
without a sync, as a serving engine queues its next forward while the cache's copies run. The
stand-in model itself computes little (its KV values are a few elementwise kernels).

Writes, under DIR:
- ``run.db``: the run's telemetry store (``radixscope ui DIR/run.db``);
- ``torch_trace.json.gz``: the profiler's trace (CUDA kernels, copies, runtime calls);
- ``trace.json.gz``: that trace with the store's Perfetto export merged in (the cache's ops,
  transfers, pool counters and spans as processes of their own), on the profiler's clock.
  Open it in ui.perfetto.dev.

The clocks are tied by one marker: a ``record_function`` slice whose wall-clock time the
script reads as it opens it. The overlap check reads the profiler's GPU events: a copy on the
cache's side stream overlaps compute when a kernel on another stream runs during it.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from radixscope.engine.run import RunSpec, execute
from radixscope.telemetry import export_perfetto

MARKER = "radixscope:clock"
PID_OFFSET = 1_000_000  # the store's processes, clear of the profiler's pids
MODELS = {"default": None,
          "8b": ("full", dict(layers=32, heads=8, head_dim=128, dtype=torch.bfloat16,
                              device_tokens=8192, host_tokens=32768))}
FORWARD_N = 8192  # the stand-in forward pass's square bf16 products


@dataclasses.dataclass(frozen=True)
class ShapedSpec(RunSpec):
    """A run whose cache config takes another model shape."""

    shape: dict = dataclasses.field(default_factory=dict)

    def cache_config(self):
        return dataclasses.replace(super().cache_config(), **self.shape)


def forward_pass(products: int):
    """An engine-step hook queueing ``products`` bf16 matrix products on the current stream
    (no sync), or None for none."""
    if not products:
        return None
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(FORWARD_N, FORWARD_N, dtype=torch.bfloat16, device="cuda", generator=g)
    out = torch.empty_like(a)

    def step(_engine) -> None:
        for _ in range(products):
            torch.mm(a, a, out=out)
    return step


def run_profiled(out: Path, requests: int | None, model: str,
                 forward: int = 0) -> tuple[dict, int, object]:
    """Run the default workload under the profiler; the trace, the marker's wall-clock ns,
    and the run's result."""
    if MODELS[model] is None:
        spec = RunSpec(store=str(out / "run.db"), requests=requests)
    else:
        preset, shape = MODELS[model]
        spec = ShapedSpec(store=str(out / "run.db"), requests=requests, preset=preset,
                          shape=shape)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(MARKER):
            mark_ns = time.time_ns()
        result = execute(spec, on_step=forward_pass(forward))
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "t.json"
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
    return trace, mark_ns, result


def slim(trace: dict) -> dict:
    """The trace without the CPU operator slices (every aten call of the run), keeping the
    marker, GPU work, runtime calls and flows."""
    keep = [e for e in trace["traceEvents"]
            if e.get("cat") != "cpu_op" or e.get("name") == MARKER]
    return {**trace, "traceEvents": keep}


def merge(trace: dict, ours: dict, mark_ns: int) -> dict:
    """``ours`` (a store's Perfetto export: microseconds from its ``t0_unix_ns``) shifted onto
    ``trace``'s clock by the marker, as processes of their own."""
    (mark,) = [e for e in trace["traceEvents"] if e.get("name") == MARKER and "ts" in e]
    t0 = ours["metadata"]["t0_unix_ns"]
    shift_us = (t0 - mark_ns) / 1000.0 + float(mark["ts"])  # our ts 0 on the trace's clock
    events = []
    for e in ours["traceEvents"]:
        e = dict(e)
        e["pid"] = PID_OFFSET + int(e["pid"])
        if "ts" in e:
            e["ts"] = float(e["ts"]) + shift_us
        events.append(e)
    return {**trace, "traceEvents": trace["traceEvents"] + events}


def overlap(trace: dict) -> dict:
    """Copies on each stream, and how many of them (and how much of their time) ran while a
    kernel ran on another stream."""
    gpu = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in
           ("kernel", "gpu_memcpy")]
    kernels = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["tid"])
                      for e in gpu if e["cat"] == "kernel")
    starts = [k[0] for k in kernels]
    longest = max((k[1] - k[0] for k in kernels), default=0.0)
    copies: dict[object, list[tuple[float, float]]] = {}
    for e in gpu:
        if e["cat"] == "gpu_memcpy":
            copies.setdefault(e["tid"], []).append((float(e["ts"]),
                                                    float(e["ts"]) + float(e["dur"])))
    out = {}
    for stream, spans in copies.items():
        n_over = 0
        t_over = 0.0
        busy = 0.0
        for a, b in spans:
            busy += b - a
            hit = 0.0
            for ka, kb, kt in kernels[bisect.bisect_left(starts, a - longest):]:
                if ka >= b:
                    break
                if kt != stream and kb > a:
                    hit += min(b, kb) - max(a, ka)
            if hit > 0:
                n_over += 1
                t_over += min(hit, b - a)
        out[str(stream)] = {"copies": len(spans), "overlapping": n_over,
                            "copy_us": round(busy, 1), "overlap_us": round(t_over, 1)}
    out["kernels"] = len(kernels)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the store and the traces")
    p.add_argument("--requests", type=int, help="requests (default: the workload's)")
    p.add_argument("--model", choices=sorted(MODELS), default="default",
                   help="the preset's shape (default) or a real model's (8b)")
    p.add_argument("--forward", type=int, default=0, metavar="N",
                   help="a stand-in forward pass of N bf16 8192^3 products after every step")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_trace: needs CUDA (the run's device pools on the GPU)", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    trace, mark_ns, result = run_profiled(out, a.requests, a.model, a.forward)
    trace = slim(trace)
    with gzip.open(out / "torch_trace.json.gz", "wt") as f:
        json.dump(trace, f)
    ours_path = out / "store_trace.json"
    counts = export_perfetto(out / "run.db", ours_path)
    merged = merge(trace, json.loads(ours_path.read_text()), mark_ns)
    ours_path.unlink()
    with gzip.open(out / "trace.json.gz", "wt") as f:
        json.dump(merged, f)
    ov = overlap(trace)
    cfg = result.config
    print(f"run: {a.model} model ({cfg.layers} layers x {cfg.heads} heads x {cfg.head_dim}, "
          f"{str(cfg.dtype).removeprefix('torch.')}, {'+'.join(cfg.components)}), "
          f"forward pass {a.forward} products a step, "
          f"{result.engine.total} requests, ok={result.ok}, {result.wall_s:.2f} s; "
          f"store events merged: {counts}")
    print(f"GPU kernels: {ov.pop('kernels')}")
    for stream, o in ov.items():
        share = 100.0 * o["overlap_us"] / o["copy_us"] if o["copy_us"] else 0.0
        print(f"  copies on {stream}: {o['copies']}, {o['overlapping']} overlap a kernel on "
              f"another stream; {o['overlap_us']:.0f} of {o['copy_us']:.0f} us ({share:.0f} %)")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
