"""L3 storage backends: payload bytes/s of batched set and get, vs an in-process copy.

Page shape (scaled from an 8B-class model): 8 layers x 2 (K, V) x 16 tokens x 8 KV heads x 128
head dim, bf16 = 512 KiB per page (a 32-layer model would be 2 MiB). Each call moves one batch
of 64 pages (32 MiB) between a host KV buffer ``[layers, 2, slots, heads, head_dim]`` and the
backend. Set writes fresh keys every round (no EXISTS shortcut); get reads them back into other
host slots and is verified. The baseline is the same pages copied host -> host in process
(``HostPages.gather`` + ``scatter``: the copy a get must do anyway), and a plain memcpy
of the same number of bytes. Servers run on 127.0.0.1,
started and stopped here.

    python bench/bench_storage.py                  # file, redis, mooncake where installed
    python bench/bench_storage.py --rounds 3 --backends file,redis
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

from radixscope.cache.storage import (  # noqa: E402
    FileBackend,
    Fingerprint,
    HostPages,
    StorageBackend,
    page_hashes,
)

LAYERS, HEADS, HEAD_DIM, PAGE, BATCH = 8, 8, 128, 16, 64


def host_pages(seed: int) -> HostPages:
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn((LAYERS, 2, 2 * BATCH * PAGE, HEADS, HEAD_DIM), generator=g)
    return HostPages(buf.to(torch.bfloat16), PAGE, 2)


def run(backend: StorageBackend, rounds: int) -> tuple[float, float]:
    src, dst = host_pages(1), host_pages(2)
    lo = torch.arange(0, BATCH * PAGE)
    hi = torch.arange(BATCH * PAGE, 2 * BATCH * PAGE)
    set_s, get_s = [], []
    for r in range(rounds):
        fp = Fingerprint(f"bench-{r}", "bfloat16", LAYERS, HEADS, HEAD_DIM, PAGE, "full",
                         src.layout)
        keys = fp.keys(page_hashes(list(range(r, r + BATCH * PAGE)), PAGE))
        s = backend.batch_set(keys, src, lo)
        g = backend.batch_get(keys, dst, hi)
        if not (s.statuses and all(x.value == "ok" for x in s.statuses)) or g.prefix_ok != BATCH:
            raise RuntimeError(f"{backend.name}: set {s.reasons()} get {g.reasons()} {s.error}")
        if not torch.equal(dst.buf[:, :, BATCH * PAGE:], src.buf[:, :, :BATCH * PAGE]):
            raise RuntimeError(f"{backend.name}: data differs after the round trip")
        set_s.append(s.seconds)
        get_s.append(g.seconds)
    backend.clear()
    nbytes = BATCH * src.page_nbytes
    return nbytes / statistics.median(set_s), nbytes / statistics.median(get_s)


def baseline(rounds: int) -> tuple[float, float]:
    """(plain memcpy of the batch's bytes, host -> host page copy by gather + scatter)."""
    src, dst = host_pages(1), host_pages(2)
    nbytes = BATCH * src.page_nbytes
    flat_src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    flat_dst = torch.empty_like(flat_src)
    firsts = list(range(0, BATCH * PAGE, PAGE))
    out = list(range(BATCH * PAGE, 2 * BATCH * PAGE, PAGE))
    mem, pages = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        flat_dst.copy_(flat_src)
        t1 = time.perf_counter()
        dst.scatter(out, src.gather(firsts))
        pages.append(time.perf_counter() - t1)
        mem.append(t1 - t0)
    return nbytes / statistics.median(mem), nbytes / statistics.median(pages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backends", default="file,redis,mooncake")
    args = ap.parse_args()
    from tests.kits.storagekit import MooncakeCluster, RedisServer, mooncake_missing

    page_bytes = host_pages(0).page_nbytes
    print(f"page: {LAYERS} layers x 2 x {PAGE} tokens x {HEADS} heads x {HEAD_DIM} dim bf16 = "
          f"{page_bytes // 1024} KiB; batch {BATCH} pages = {BATCH * page_bytes >> 20} MiB; "
          f"{args.rounds} rounds, median")
    base, pages = baseline(args.rounds)
    print(f"{'backend':<14}{'set MB/s':>10}{'get MB/s':>10}{'set/memcpy':>12}{'get/memcpy':>12}"
          f"{'set/pagecp':>12}{'get/pagecp':>12}")
    print(f"{'memcpy':<14}{base / 1e6:>10.0f}{base / 1e6:>10.0f}{1:>12.2f}{1:>12.2f}"
          f"{base / pages:>12.2f}{base / pages:>12.2f}")
    print(f"{'page copy':<14}{pages / 1e6:>10.0f}{pages / 1e6:>10.0f}{pages / base:>12.2f}"
          f"{pages / base:>12.2f}{1:>12.2f}{1:>12.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.backends.split(","):
            stop = None
            if name == "file":
                backend: StorageBackend = FileBackend(Path(tmp) / "l3")
            elif name == "redis":
                from radixscope.cache.storage import RedisBackend

                server = RedisServer(Path(tmp))
                server.start()
                stop = server.stop
                backend = RedisBackend(server.url)
            elif name == "mooncake":
                why = mooncake_missing()
                if why:
                    print(f"{name:<14}skipped: {why}")
                    continue
                from radixscope.cache.storage import MooncakeBackend

                cluster = MooncakeCluster(Path(tempfile.mkdtemp(dir=tmp)), segment="512MB")
                cluster.start()
                stop = cluster.stop
                backend = MooncakeBackend(cluster.master, cluster.metadata,
                                          local_buffer_size=128 << 20)
            else:
                raise SystemExit(f"unknown backend {name!r}")
            try:
                w, r = run(backend, args.rounds)
            finally:
                backend.close()
                if stop:
                    stop()
            print(f"{name:<14}{w / 1e6:>10.0f}{r / 1e6:>10.0f}{w / base:>12.2f}{r / base:>12.2f}"
                  f"{w / pages:>12.2f}{r / pages:>12.2f}")


if __name__ == "__main__":
    main()
