"""L3 prefetch: hit rate and added latency per stop policy, on a realistic page shape.

Page: 8 layers x 2 (K, V) x 16 tokens x 8 KV heads x 128 head dim, bf16 = 512 KiB. A request
misses 64 pages (1024 tokens, 32 MiB) past its host match; all 64 are in storage. The
"scheduler" starts the prefetch, then polls once per step (``--step-ms``, a forward pass) and
schedules the request when the prefetch is handed back. Per policy: hit rate = tokens handed
back / tokens in storage; added latency = start to hand-back (what the request waits before
prefill). Two stores: the backend as is, and the same behind ``FaultyBackend(delay=...)`` (a
slow or loaded store: a random sleep per call), where the timeout budget (1 s + 0.25 s per
1024 tokens) binds. The in-process baseline is the same 64 pages copied host -> host in this
process (``HostPages.gather`` + ``scatter``, what a get must do anyway): each policy's added
latency is also printed as a ratio to it. ``--observer`` reports every event into telemetry's
prefetch observer (spans through an SDK tracer provider, events into a recorder) to show what
observing costs.

    python bench/bench_prefetch.py                       # file
    python bench/bench_prefetch.py --backends file,redis --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from radixscope.cache.pools import SlotAllocator  # noqa: E402
from radixscope.cache.storage import (  # noqa: E402
    FaultyBackend,
    FileBackend,
    Fingerprint,
    HostPages,
    PrefetchConfig,
    PrefetchController,
    PrefetchPool,
    StopPolicy,
    StorageBackend,
    page_hashes,
)

LAYERS, HEADS, HEAD_DIM, PAGE, PAGES = 8, 8, 128, 16, 64


def host(slots: int, seed: int | None) -> HostPages:
    shape = (LAYERS, 2, slots, HEADS, HEAD_DIM)
    if seed is None:
        return HostPages(torch.zeros(shape, dtype=torch.bfloat16), PAGE, 2)
    g = torch.Generator().manual_seed(seed)
    return HostPages(torch.randn(shape, generator=g).to(torch.bfloat16), PAGE, 2)


def run(backend: StorageBackend, policy: StopPolicy, hashes: tuple[bytes, ...], batch: int,
        dst: HostPages, fp: Fingerprint, step_s: float, observer=None) -> tuple[float, float]:
    alloc = SlotAllocator("full/host", dst.buf.shape[2], PAGE)
    ctl = PrefetchController(backend, PrefetchPool("full", dst, alloc, fp),
                             config=PrefetchConfig(policy=policy, max_host_share=1.0,
                                                   batch_pages=batch), observer=observer)
    t0 = time.perf_counter()
    ctl.start("r", hashes)
    got: list = []
    while not got:
        time.sleep(step_s)
        got = list(ctl.poll())
    dt = time.perf_counter() - t0
    ctl.close()
    return got[0].tokens / (len(hashes) * PAGE), dt


def in_process(src: HostPages, dst: HostPages, rounds: int) -> float:
    """Seconds to copy the request's pages host -> host in this process (median)."""
    firsts = list(range(0, PAGES * PAGE, PAGE))
    out = list(range(PAGES * PAGE, 2 * PAGES * PAGE, PAGE))
    times = []
    for _ in range(max(3, rounds)):
        t0 = time.perf_counter()
        dst.scatter(out, src.gather(firsts))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_observer():
    """Telemetry's prefetch observer on an SDK tracer provider (no exporter) and a recorder."""
    from opentelemetry.sdk.trace import TracerProvider

    from radixscope.telemetry.record.drops import Health
    from radixscope.telemetry.record.prefetch import TelemetryPrefetchObserver
    from radixscope.telemetry.record.recorder import TelemetryRecorder

    health = Health()
    return TelemetryPrefetchObserver(TelemetryRecorder(health), health,
                                     tracer_provider=TracerProvider())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--delay", type=float, default=0.3, help="slow store: max sleep per call")
    ap.add_argument("--batch", type=int, default=8, help="pages per get call")
    ap.add_argument("--observer", action="store_true", help="report into telemetry's observer")
    args = ap.parse_args()
    observer = make_observer() if args.observer else None
    src = host(PAGES * PAGE, 0)
    dst = host(2 * PAGES * PAGE, None)
    fp = Fingerprint("bench", "bfloat16", LAYERS, HEADS, HEAD_DIM, PAGE, "full", src.layout)
    copy_s = in_process(src, dst, args.rounds)
    print(f"page {src.page_nbytes / 2**10:.0f} KiB, {PAGES} pages ({PAGES * PAGE} tokens, "
          f"{PAGES * src.page_nbytes / 2**20:.0f} MiB), step {args.step_ms} ms, "
          f"{args.rounds} rounds, median; observer {'on' if observer else 'off'}")
    print(f"in-process baseline (host -> host copy of the {PAGES} pages): "
          f"{copy_s * 1000:.1f} ms, hit rate 1.00")
    print("| backend | store | policy | hit rate | added latency ms | latency / in-process copy "
          "| latency / wait_complete |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.backends.split(","):
            server = None
            if name == "file":
                inner: StorageBackend = FileBackend(Path(tmp) / "l3")
            else:
                from radixscope.cache.storage import RedisBackend
                from tests.kits.storagekit import RedisServer
                (Path(tmp) / "redis").mkdir()  # redis-server exits on a missing --dir
                server = RedisServer(Path(tmp) / "redis")
                server.start()
                inner = RedisBackend(server.url)
            for store in ("as is", f"delay<={args.delay}s/call"):
                backend = inner if store == "as is" else FaultyBackend(inner, delay=args.delay,
                                                                      seed=1)
                rows = {}
                for rnd in range(args.rounds):
                    hashes = page_hashes(list(range(rnd * 10**6, rnd * 10**6 + PAGES * PAGE)),
                                         PAGE, extra_key=store)
                    keys = fp.keys(hashes)
                    assert inner.batch_set(keys, src, torch.arange(PAGES * PAGE)).all_ok
                    for pol in StopPolicy:
                        rows.setdefault(pol, []).append(
                            run(backend, pol, hashes, args.batch, dst, fp, args.step_ms / 1000,
                                observer))
                base = statistics.median(d for _, d in rows[StopPolicy.WAIT_COMPLETE])
                for pol, vals in rows.items():
                    hit = statistics.median(h for h, _ in vals)
                    lat = statistics.median(d for _, d in vals)
                    print(f"| {name} | {store} | {pol.value} | {hit:.2f} | {lat * 1000:.0f} | "
                          f"{lat / copy_s:.1f} | {lat / base:.2f} |")
            inner.close()
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
