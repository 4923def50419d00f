"""Server-side cost of the UI: building the Tree page's figure, and rebuilding the tree at a seq.

1. **Tree figure** for synthetic snapshots of 1k, 10k and 100k nodes
   (``ui.shaping.synthetic``): ``tree_model`` (once per seq; cached by the page), the level of
   detail ``lod_sectors`` (defaults: depth 6, 2000 sectors, 0.2 % floor), the three side-by-side
   icicles ``icicle_figure`` and the figure's JSON (what Streamlit ships to the browser).
   Baseline in the same process: the same pipeline drawing every node (no level of detail).
2. **state_at** on stores holding 10^5 and 10^6 mutations, written by a real ``HiRadixCache``
   running a multi-turn chat workload (8 system prompts, 256 conversations, 16k device / 128k
   host tokens) through ``telemetry.setup(mode="inline")`` (spans and
   metrics off: only the journal, keyframes every 5000 mutations, matter here). ``state_at``
   at random seqs (nearest keyframe + replay) against the baseline of replaying the journal
   from its first keyframe.

    python bench/bench_ui.py                       # everything (the 10^6 store takes minutes)
    python bench/bench_ui.py --mutations 100000    # skip the 10^6 store
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from radixscope import telemetry
from radixscope.cache import CacheConfig, HiRadixCache
from radixscope.cache.snapshot import replay
from radixscope.ui.shaping.icicle import icicle_figure
from radixscope.ui.shaping.lod import lod_sectors
from radixscope.ui.shaping.synthetic import synthetic_snapshot
from radixscope.ui.shaping.tree import tree_model


def _ms(fn, reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def bench_figure(sizes: list[int], reps: int) -> None:
    print("## Tree figure (median ms)")
    print("| nodes | sectors | tree_model | lod | icicles | json | figure total (lod+icicles+json)"
          " | page total (+tree_model) | all nodes drawn | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        snap = synthetic_snapshot(n)
        r = reps if n < 100_000 else max(1, reps // 2)
        t_model, model = _ms(lambda s=snap: tree_model(s), r)
        t_lod, sectors = _ms(lambda m=model: lod_sectors(m), r)
        t_fig, fig = _ms(lambda m=model, s=sectors: icicle_figure(m, s), r)
        t_json, _ = _ms(lambda f=fig: f.to_json(), r)
        fig_total = t_lod + t_fig + t_json

        def everything(m=model, n=n):
            s = lod_sectors(m, depth=10_000, max_sectors=n + 1, min_share=0.0)
            return icicle_figure(m, s).to_json()

        t_all, _ = _ms(everything, 1)
        print(f"| {n:,} | {len(sectors):,} | {t_model:.0f} | {t_lod:.0f} | {t_fig:.0f} | "
              f"{t_json:.0f} | {fig_total:.0f} | {fig_total + t_model:.0f} | {t_all:.0f} | "
              f"{fig_total / t_all:.3f} |", flush=True)


def make_store(path: Path, mutations: int, seed: int = 3) -> tuple[int, float]:
    """Drive a real cache until the store holds at least ``mutations`` mutations."""
    tel = telemetry.setup(store=path, overwrite=True, mode="inline", spans=False, metrics=False,
                          keyframe_every=5000, sample_every_ms=1000.0,
                          queue_capacity=1 << 20)
    cfg = CacheConfig.preset("full", device_tokens=16384, host_tokens=131072)
    cache = HiRadixCache(cfg, recorder=tel.recorder)
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(128)] for _ in range(8)]
    convs = [list(systems[i % 8]) for i in range(256)]
    t0 = time.perf_counter()
    i = 0
    while cache.seq < mutations:
        i += 1
        ci = rng.randrange(len(convs))
        if len(convs[ci]) > 1024:
            convs[ci] = list(systems[ci % 8])
        conv = convs[ci]
        conv.extend(rng.randrange(32000) for _ in range(rng.randint(8, 32)))
        rid = f"r{i}"
        m = cache.match_prefix(conv, req_id=rid)
        idx, pre, anchor = m.device_indices, m.device_prefix_len, m.last_device_node
        if m.host_hit_length > 0:
            lb = cache.load_back(m, req_id=rid)
            idx, pre, anchor = lb.device_indices, lb.device_prefix_len, lb.anchor
        receipt = cache.lock(anchor, owner=rid, req_id=rid)
        answer = [rng.randrange(32000) for _ in range(rng.randint(8, 48))]
        full = conv + answer
        new = cache.alloc(len(full) - pre, req_id=rid)
        cache.insert(full, torch.cat([idx, new]), prev_prefix_len=pre, req_id=rid)
        cache.unlock(receipt, req_id=rid)
        cache.poll(wait=True)
        conv.extend(answer)
    seq = cache.seq
    tel.close(timeout_s=1200)
    return seq, time.perf_counter() - t0


def bench_state_at(counts: list[int], probes: int) -> None:
    print("## state_at (ms)")
    print("| mutations | nodes at the end | keyframes | store MB | state_at median | state_at p95 "
          "| full replay (first keyframe -> last seq) | ratio | store written in |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as d:
        for count in counts:
            path = Path(d) / f"m{count}.db"
            last, gen_s = make_store(path, count)
            with telemetry.open_store(path) as r:
                kf = r.keyframes()
                seqs = [rng.randint(int(kf["seq"].min()), last) for _ in range(probes)]
                times = []
                for s in seqs:
                    t0 = time.perf_counter()
                    r.state_at(s)
                    times.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                first = r.keyframe(int(kf["seq"].min()))
                full = replay(first, r.journal(int(kf["seq"].min()) + 1, last))
                t_full = (time.perf_counter() - t0) * 1e3
                assert full == r.state_at(last)
            med = statistics.median(times)
            p95 = sorted(times)[int(0.95 * (len(times) - 1))]
            mb = path.stat().st_size / 2**20
            print(f"| {last:,} | {len(full.nodes):,} | {len(kf):,} | {mb:.0f} | {med:.0f} | "
                  f"{p95:.0f} | {t_full:.0f} | {med / t_full:.4f} | {gen_s:.0f} s |", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    ap.add_argument("--mutations", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--probes", type=int, default=20)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.nodes:
        bench_figure(args.nodes, args.reps)
    if args.mutations:
        bench_state_at(args.mutations, args.probes)


if __name__ == "__main__":
    main()
