"""Backup (device -> pinned host) and load-back (host -> device) against the copy ceiling.

The ceiling is a plain ``non_blocking`` copy of the same bytes between one pinned buffer and
one device buffer, on a side stream, timed with CUDA events. The cache's transfers are timed
the same way: each CUDA transfer carries a pair of events on the side stream
(``TransferEngine``; the ack's ``copy_ns``). Also printed: the wall time from the call that
submits the transfer to its ack (the cache's own work included).

KV of a realistic shape (default 32 layers x 8 KV heads x 128 head dim, bf16: 128 KiB a token),
one request of ``--tokens`` tokens a transfer, page sizes 1 and 16, with the slots
- ``contiguous``: a fresh pool (each side one run of slots);
- ``fragmented``: both pools' free lists shuffled first, so each page is a run of its own (the
  worst an allocator can hand out after churn).
Paths (the ``path`` column): ``memcpy2d`` (one 2-D DMA a run), ``staged`` (a gather, one bulk
copy through a pinned slab, a scatter: ``cache/staged.py``), each forced for every copy of the
case (the engine's ``staged_below``); ``--rows`` adds the per-row fallback (one ``copy_`` per
layer and K/V a run; what runs where the CUDA runtime's 2-D copy cannot be loaded). A staged
backup's copy time leaves out its scatter into the host pool (on the CPU, at the ack: in the
wall time); a staged load-back's includes the CPU gather that precedes its upload.
``tiny-frag`` rows: the default ``radixscope run`` preset's shape (1 layer x 2 KV heads x 16 dim,
f32: 256 B a token), page 1, fragmented, ``--tiny-tokens`` a transfer: runs of 256 B, where one DMA
a run costs most (the case the staged path is for). ``--baseline FILE`` adds the same cases run by
the ``TransferEngine`` of another revision's ``cache/transfer_engine.py`` (``git show
REV:cache/transfer_engine.py > FILE``), timed by the wall clock from submit to ack, as the current
engine's ``wall GB/s`` is. Each transfer's content is checked.

Run on a GPU: ``python bench/bench_gpu.py`` (``--json FILE`` keeps the numbers). Without CUDA
it runs the same steps on the CPU (deferred copies, wall time only: a smoke run of the script).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time

import torch

from radixscope.cache import CacheConfig, HiRadixCache
from radixscope.cache.staged import RUNS, STAGED

ALWAYS = 1 << 62  # a ``staged_below`` every copy is under


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048, help="tokens a transfer (default 2048)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--pages", default="1,16", help="page sizes (default 1,16)")
    p.add_argument("--reps", type=int, default=5, help="transfers a case (median; default 5)")
    p.add_argument("--rows", action="store_true", help="also the per-row fallback")
    p.add_argument("--tiny-tokens", type=int, default=256,
                   help="tokens a transfer of the tiny-frag case (0: no such case; default 256)")
    p.add_argument("--baseline", metavar="FILE", help="another revision's transfer_engine.py")
    p.add_argument("--json", metavar="FILE", help="write the results here")
    return p.parse_args(argv)


class Clock:
    """Times work on a stream: CUDA events, or the wall clock on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.stream = torch.cuda.Stream() if cuda else None

    def time(self, fn) -> float:
        """Seconds ``fn`` takes on the stream."""
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            a.record()
            fn()
            b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3


def ceiling(clock: Clock, nbytes: int, device: str, reps: int) -> dict[str, float]:
    """Seconds (median) of one plain copy of ``nbytes`` each way, pinned <-> device."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=clock.cuda)
    out = {}
    for name, fn in (("backup", lambda: host.copy_(dev, non_blocking=True)),
                     ("load_back", lambda: dev.copy_(host, non_blocking=True))):
        clock.time(fn)  # warm-up
        out[name] = statistics.median(clock.time(fn) for _ in range(reps))
    return out


def shuffle_free_list(alloc, rng: torch.Generator) -> None:
    """Take every free page of ``alloc`` and give them back in a random order: the next
    allocations come out one page a run."""
    taken = alloc.alloc(alloc.available)
    if taken is None or taken.numel() == 0:
        return
    p = alloc.page_size
    pages = taken.view(-1, p)[torch.randperm(taken.numel() // p, generator=rng)]
    alloc.free(pages.reshape(-1))


def baseline_engine(path: str, device: str):
    """The ``TransferEngine`` of another revision's module file, its ``collect`` giving this
    revision's 4-tuples (no copy time: the wall clock times it)."""
    spec = importlib.util.spec_from_file_location("baseline_transfer_engine", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    eng = mod.TransferEngine(device)
    collect = eng.collect

    def collect4(core, ids, wait):
        return [tuple(x) + (None,) * (4 - len(x)) for x in collect(core, ids, wait)]
    eng.collect = collect4
    return eng


class Shape:
    """A model's KV shape and the tokens a transfer."""

    def __init__(self, tokens: int, layers: int, heads: int, head_dim: int,
                 dtype: torch.dtype) -> None:
        self.tokens, self.layers, self.heads, self.head_dim = tokens, layers, heads, head_dim
        self.dtype = dtype


class Case:
    """One cache: a shape, a page size, a slot pattern, a copy path."""

    def __init__(self, shape: Shape, page: int, pattern: str, path: str,
                 baseline: str | None = None) -> None:
        cuda = torch.cuda.is_available()
        t = shape.tokens
        cfg = CacheConfig(components=("full",), page_size=page, device_tokens=2 * t,
                          host_tokens=2 * t, layers=shape.layers, heads=shape.heads,
                          head_dim=shape.head_dim, dtype=shape.dtype,
                          device="cuda" if cuda else "cpu", write_policy="write_through")
        self.c = HiRadixCache(cfg)
        self.tokens = t
        self.bytes = t * self.c.device_pools[0].bytes_per_slot
        self.path = path
        self.c.engine.staged_below = ALWAYS if path == STAGED else 0
        if path == "rows":
            self.c.engine.memcpy2d = None
        elif path == "baseline":
            self.c.engine = baseline_engine(baseline, self.c.config.device)
        if pattern in ("fragmented", "tiny-frag"):
            rng = torch.Generator().manual_seed(page)
            shuffle_free_list(self.c.device_pools[0].alloc, rng)
            shuffle_free_list(self.c.host_pools[0].alloc, rng)
        self.runs = None
        self.n = 0

    def _copy_secs(self, tid: int) -> float | None:
        """The transfer's side-stream time (its events), or None where it is not timed so (the
        CPU, a baseline engine): the wall time then stands for it, marked in the table."""
        p = self.c.engine.pending[int(tid)]
        if p.event is None or not hasattr(p, "copy_ns"):
            return None
        p.event.synchronize()
        return p.copy_ns() / 1e9

    def one(self) -> dict[str, float]:
        """Insert a request (its backup), evict it, load it back; check what came back."""
        c, t = self.c, self.tokens
        self.n += 1
        key = [self.n * 1_000_003 + i for i in range(t)]
        idx = c.alloc(t)
        pool = c.device_pools[0]
        data = torch.randn((pool.buf.shape[0], 2, t, *pool.buf.shape[3:]), dtype=pool.buf.dtype,
                           device=pool.buf.device)
        pool.buf.index_copy_(2, idx.to(pool.buf.device), data)
        self.runs = int(((idx[1:] - idx[:-1]) != 1).sum()) + 1

        w0 = time.perf_counter()
        r = c.insert(key, idx)
        (bid,) = r.backups
        backup = self._copy_secs(bid)
        c.poll([bid], wait=True)
        backup_wall = time.perf_counter() - w0

        c.evict(10**9)
        m = c.match_prefix(key)
        assert m.host_hit_length == t, (m.host_hit_length, t)
        w0 = time.perf_counter()
        lb = c.load_back(m)
        load = self._copy_secs(lb.transfer_id)
        c.poll([lb.transfer_id], wait=True)
        load_wall = time.perf_counter() - w0
        back = pool.buf.index_select(2, lb.device_indices.to(pool.buf.device))
        if not torch.equal(back, data):
            raise AssertionError(f"load-back of request {self.n} returned other KV")
        c.evict(10**9)
        c.evict_host(10**9)
        c.check()
        self.check_path()
        return {"backup": backup, "backup_wall": backup_wall, "load_back": load,
                "load_back_wall": load_wall}


    def check_path(self) -> None:
        """Raise unless the case's copies took its path (CUDA; the engine counts them)."""
        on = getattr(self.c.engine, "copies", None)
        if not self.c.config.device.startswith("cuda") or on is None:
            return
        want = {STAGED: STAGED, "memcpy2d": RUNS, "rows": RUNS}.get(self.path)
        if want is not None and set(k for k, v in on.items() if v) != {want}:
            raise AssertionError(f"path {self.path}: the copies went {on}")
        m2d = self.c.engine.memcpy2d
        if self.path == "memcpy2d" and (m2d is None or m2d.row_copies):
            raise AssertionError(f"path memcpy2d: runs went row by row (max pitch "
                                 f"{getattr(m2d, 'max_pitch', None)} B)")


def cases(a: argparse.Namespace, cuda: bool) -> list[tuple[Shape, int, str, str]]:
    """(shape, page, slot pattern, path) of every case, in table order."""
    big = Shape(a.tokens, a.layers, a.heads, a.head_dim, torch.bfloat16)
    paths = (["memcpy2d", STAGED] if cuda else ["cpu"]) + (["rows"] if a.rows and cuda else []) \
        + (["baseline"] if a.baseline else [])
    out = [(big, page, pattern, path) for page in (int(x) for x in a.pages.split(","))
           for pattern in ("contiguous", "fragmented") for path in paths]
    if a.tiny_tokens > 0:  # the default preset's shape: 256 B a token, page 1, scattered
        tiny = Shape(a.tiny_tokens, 1, 2, 16, torch.float32)
        out += [(tiny, 1, "tiny-frag", path) for path in paths]
    return out


def run(a: argparse.Namespace) -> list[dict]:
    cuda = torch.cuda.is_available()
    clock = Clock(cuda)
    out = []
    for shape, page, pattern, path in cases(a, cuda):
        case = Case(shape, page, pattern, path, a.baseline)
        case.one()  # warm-up
        reps = [case.one() for _ in range(a.reps)]
        ceil = ceiling(clock, case.bytes, case.c.config.device, a.reps)
        for kind in ("backup", "load_back"):
            wall = statistics.median(r[kind + "_wall"] for r in reps)
            timed = reps[0][kind] is not None  # else the wall time stands for it
            secs = statistics.median(r[kind] for r in reps) if timed else wall
            out.append({"page": page, "slots": pattern, "runs": case.runs,
                        "path": path, "shape": [shape.layers, shape.heads,
                                                shape.head_dim, str(shape.dtype)],
                        "kind": kind, "bytes": case.bytes,
                        "ceiling_gbs": case.bytes / ceil[kind] / 1e9,
                        "copy_gbs": case.bytes / secs / 1e9 if timed else None,
                        "wall_gbs": case.bytes / wall / 1e9,
                        "ratio": ceil[kind] / secs, "ratio_of": "copy" if timed
                        else "wall"})
        del case
        if cuda:
            torch.cuda.empty_cache()
    return out


def _gbs(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"  # tiny-frag's rates are below 1


def main(argv=None) -> int:
    a = parse_args(argv)
    cuda = torch.cuda.is_available()
    dev = torch.cuda.get_device_name() if cuda else "no CUDA: CPU smoke run (wall time)"
    print(f"device: {dev}; torch {torch.__version__}; {a.tokens} tokens x {a.layers} layers x "
          f"{a.heads} heads x {a.head_dim} dim, bf16 (tiny-frag: {a.tiny_tokens} tokens x 1 x 2 "
          f"x 16, f32); median of {a.reps}", flush=True)
    rows = run(a)
    print(f"{'page':>4} {'slots':<11}{'runs':>6} {'path':<9}{'kind':<10}{'MB':>7}"
          f"{'ceiling GB/s':>14}{'copy GB/s':>11}{'ratio':>7}{'wall GB/s':>11}")
    for r in rows:  # ratio: of the copy time, or (marked w) of the wall time where untimed
        copy = "-" if r["copy_gbs"] is None else _gbs(r["copy_gbs"])
        mark = " " if r["ratio_of"] == "copy" else "w"
        print(f"{r['page']:>4} {r['slots']:<11}{r['runs']:>6} {r['path']:<9}{r['kind']:<10}"
              f"{r['bytes'] / 1e6:>7.{0 if r['bytes'] >= 1e7 else 2}f}"
              f"{r['ceiling_gbs']:>14.1f}{copy:>11}"
              f"{r['ratio']:>6.2f}{mark}{_gbs(r['wall_gbs']):>11}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "args": vars(a),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
