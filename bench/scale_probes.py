"""What ``bench_scale.py`` reads of the process around its batches: the native kernels' calls
(``--kernels``), the garbage collector's pauses, memory, the cache thread's page faults, and the
writer process's state (``--pause-writer``)."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixscope.cache import native  # noqa: E402

KERNELS = ("check_split", "alloc_pages", "free_pages")
CURRENT = [""]  # the label of the run whose batch is running (``--kernels``)


def time_kernels() -> dict[tuple[str, str], list[int]]:
    """Wrap the native kernels the pools call (``native.<name>``, looked up at each call) with
    a timer; returns ``(run label, kernel) -> [ns per call]``, filled during batches only."""
    calls: dict[tuple[str, str], list[int]] = {}
    clock = time.perf_counter_ns

    def timer(name: str, fn):
        def timed(*args):
            t0 = clock()
            out = fn(*args)
            if CURRENT[0]:
                calls.setdefault((CURRENT[0], name), []).append(clock() - t0)
            return out
        return timed

    for name in KERNELS:
        setattr(native, name, timer(name, getattr(native, name)))
    return calls


class GcPauses:
    """The garbage collector's pauses inside the batches (``on`` while one runs): each
    collection's generation and wall time. Collections are the process's, not one cache's:
    both caches' objects are scanned by every one."""

    def __init__(self) -> None:
        self.on = False
        self.pauses: list[tuple[int, int]] = []  # (generation, ns)
        self._t0 = 0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        else:
            self.pauses.append((info["generation"], time.perf_counter_ns() - self._t0))

    def line(self, requests: int) -> str:
        p = self.pauses
        if not p:
            return "no collection ran during the batches"
        gens = "/".join(str(sum(1 for g, _ in p if g == i)) for i in range(3))
        return (f"{len(p)} collections during the batches (gen 0/1/2: {gens}), longest "
                f"{max(ns for _, ns in p) / 1e6:.2f} ms, {sum(ns for _, ns in p) / requests / 1e3:.2f}"
                f" us a request")


GC_PAUSES = GcPauses()


def full_collection_ms() -> float:
    """One full collection's wall time, every run's cache resident (the best of three)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def proc_stat(path: str) -> list[str] | None:
    """The fields of a ``/proc/.../stat`` file after the command name (the state letter
    first), or None where there is no such file."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def thread_faults() -> int | None:
    """Minor page faults of the calling thread so far, None where ``/proc`` has no such file.
    A cache whose batches fault far more than the baseline's is writing into fresh memory each
    batch: how the recorder buffer left at a burst's size was found (RESULTS.md, #17,
    twenty-fifth round)."""
    fields = proc_stat("/proc/thread-self/stat")
    return None if fields is None else int(fields[7])


def stop_process(pid: int, timeout_s: float = 2.0) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (a signal is delivered when the process
    next runs: the batch after must not start with it still working)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while process_state(pid) not in ("T", "t", None) and time.monotonic() < deadline:
        time.sleep(0.001)


def process_state(pid: int) -> str | None:
    """``pid``'s state letter in ``/proc`` (``T``: stopped), or None where there is none."""
    fields = proc_stat(f"/proc/{pid}/stat")
    return None if fields is None else fields[0]
