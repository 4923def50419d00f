"""bench/gpu_trace.py's trace tools, on the CPU: the marker ties the store's clock to the
profiler's, and the overlap count reads streams from GPU events. (The profiled run itself
needs CUDA: ``python bench/gpu_trace.py --out DIR`` on a GPU.)"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

_spec = importlib.util.spec_from_file_location(
    "gpu_trace", Path(__file__).resolve().parents[2] / "bench" / "gpu_trace.py")
gpu_trace = importlib.util.module_from_spec(_spec)
sys.modules["gpu_trace"] = gpu_trace  # its dataclass looks its module up
_spec.loader.exec_module(gpu_trace)


def test_the_marker_puts_a_store_timestamp_where_the_profiler_saw_it(tmp_path):
    """Each clock read is bracketed: a virtual machine's host can stop the thread between the
    profiler's timestamp and ours (for 3.6 ms once, in a full run of the suite), and that time
    is allowed on top of the 2 ms."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        before_mark = time.time_ns()
        with record_function(gpu_trace.MARKER):
            mark_ns = time.time_ns()
        time.sleep(0.02)
        before_later = time.time_ns()
        with record_function("later"):
            later_ns = time.time_ns()
            torch.ones(4).sum()
    slack_us = (mark_ns - before_mark + later_ns - before_later) / 1000.0
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    import json
    trace = gpu_trace.slim(json.loads((tmp_path / "t.json").read_text()))
    assert all(e.get("cat") != "cpu_op" or e["name"] == gpu_trace.MARKER
               for e in trace["traceEvents"])
    t0 = mark_ns - 5_000_000
    ours = {"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "name": "op",
                             "ts": (later_ns - t0) / 1000.0, "dur": 1.0},
                            {"ph": "M", "pid": 2, "tid": 0, "name": "process_name",
                             "args": {"name": "spans"}}],
            "metadata": {"t0_unix_ns": t0}}
    merged = gpu_trace.merge(trace, ours, mark_ns)
    (op,) = [e for e in merged["traceEvents"] if e.get("name") == "op"]
    assert op["pid"] == gpu_trace.PID_OFFSET + 1
    raw = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    (later,) = [e for e in raw if e.get("name") == "later"]
    # within 2 ms of where torch saw it, and what the host took between the two reads
    assert abs(op["ts"] - float(later["ts"])) < 2_000 + slack_us


def test_overlap_counts_copies_that_run_beside_a_kernel_on_another_stream():
    ev = [{"ph": "X", "cat": "kernel", "tid": 7, "ts": 0, "dur": 10},
          {"ph": "X", "cat": "kernel", "tid": 13, "ts": 50, "dur": 10},
          {"ph": "X", "cat": "gpu_memcpy", "tid": 13, "ts": 5, "dur": 10},   # half beside 7
          {"ph": "X", "cat": "gpu_memcpy", "tid": 13, "ts": 30, "dur": 5},   # alone
          {"ph": "X", "cat": "gpu_memcpy", "tid": 7, "ts": 52, "dur": 4}]    # beside 13
    out = gpu_trace.overlap({"traceEvents": ev})
    assert out["kernels"] == 2
    assert out["13"] == {"copies": 2, "overlapping": 1, "copy_us": 15.0, "overlap_us": 5.0}
    assert out["7"] == {"copies": 1, "overlapping": 1, "copy_us": 4.0, "overlap_us": 4.0}
