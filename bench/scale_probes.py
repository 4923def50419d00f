"""What ``bench_scale.py`` reads of the process around its batches: the native kernels' calls
(``--kernels``), the garbage collector's pauses, memory, the cache thread's page faults, the
writer process's state (``--pause-writer``), and the machine's own tail: fixed work timed between
requests (``Floor``) and the jumps of the thread's clock (``clock_jumps``)."""

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


FLOOR_US = (2, 4, 8, 16, 32, 64)  # the fixed work's durations, about, on the machine at hand


def _spin(n: int) -> int:
    """Fixed work: ``n`` turns of a loop that touches no memory beyond its frame."""
    x = 0
    for i in range(n):
        x += i
    return x


class Floor:
    """The machine's own tail: the same fixed work, timed with the ops' clock between requests
    in ``FLOOR_US`` sizes, two a request (sizes ``k`` and ``k + 3`` of six, in turn), so that
    it runs where the ops run, after the same requests' work.

    Its p99 over its median is what the machine alone adds to an op of that median. On a
    virtual machine whose host takes the CPU away now and then, that time is charged to the
    thread that was running (``clock_jumps``): an op of a few microseconds then reads a p99
    several times its median whatever its code does (RESULTS.md, #17, thirtieth round). The
    same fixed work timed in a burst after each batch, hot, read about half the excess at
    8 us: between requests it also pays for the caches the requests left cold, as a small op
    does."""

    def __init__(self) -> None:
        per_turn = self._calibrate()
        self.turns = [max(1, round(us * 1e3 / per_turn)) for us in FLOOR_US]

    @staticmethod
    def _calibrate() -> float:
        """ns a turn of ``_spin``: the median of 31 timings of 2,000 turns."""
        clock = time.thread_time_ns
        v = []
        for _ in range(31):
            t0 = clock()
            _spin(2000)
            v.append(clock() - t0)
        return max(1.0, sorted(v)[15] / 2000)

    def between(self, k: int, clock, out: list) -> None:
        """Request ``k``'s two samples onto ``out``: ``(size index, ns of the fixed work)``."""
        n = len(self.turns)
        for i in (k % n, (k + n // 2) % n):
            turns = self.turns[i]
            t0 = clock()
            _spin(turns)
            out.append((i, clock() - t0))


def floor_of(samples: list[tuple[int, int]]) -> list[tuple[float, float]]:
    """``Floor.between``'s samples as ``(median, p99)`` in us per size, by median; sizes with
    fewer than 100 samples are left out (no p99 to read)."""
    by: dict[int, list[int]] = {}
    for i, ns in samples:
        by.setdefault(i, []).append(ns)
    out = []
    for v in by.values():
        if len(v) >= 100:
            v.sort()
            out.append((v[len(v) // 2] / 1e3, v[int(len(v) * 0.99)] / 1e3))
    return sorted(out)


def clock_jumps(seconds: float = 1.0, over_ns: int = 3000) -> tuple[float, float]:
    """Reads the thread's CPU clock back to back for ``seconds`` (of that clock) and returns the
    jumps of more than ``over_ns`` between two reads: (per second, median us). A loop that
    reads a clock has no work of its own that takes that long: a jump is time the thread was
    charged for while something else had the CPU (an interrupt, or a host that took a virtual
    CPU away)."""
    clock = time.thread_time_ns
    jumps = []
    start = last = clock()
    end = start + int(seconds * 1e9)
    while last < end:
        now = clock()
        if now - last > over_ns:
            jumps.append(now - last)
        last = now
    jumps.sort()
    took = (last - start) / 1e9
    return len(jumps) / took, (jumps[len(jumps) // 2] / 1e3 if jumps else 0.0)
