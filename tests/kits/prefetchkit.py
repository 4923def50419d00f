"""A prefetch rig: source pages written to a backend, empty host pools with allocators, and a
controller over them; a gate backend to hold a get open; content checks page by page."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixscope.cache.pools import SlotAllocator
from radixscope.cache.storage import (
    FileBackend,
    Fingerprint,
    HostPages,
    PrefetchConfig,
    PrefetchController,
    PrefetchPool,
    PrefetchResult,
    StorageBackend,
    codec,
    page_hashes,
)
from radixscope.cache.storage.results import PageStatus

P = 4                 # tokens a page
SHAPE = (2, 3, 8)     # layers, heads, head_dim
HOST_PAGES = 64       # host pool pages (each pool)
WINDOW = 2            # SWA window pages
STATE = (5,)          # MAMBA state shape
POOL_SETS = {"full": (), "full+swa": ("swa",), "full+mamba": ("mamba",),
             "full+swa+mamba": ("swa", "mamba")}


def tokens(n_pages: int, offset: int = 0) -> list[int]:
    return list(range(offset, offset + n_pages * P))


def _fp(host: HostPages, component: str) -> Fingerprint:
    return Fingerprint("m", str(host.buf.dtype).removeprefix("torch."), 2, 3, 8, P, component,
                       host.layout)


class Gate(StorageBackend):
    """Delegates to ``inner``; a get whose keys match ``hold`` blocks until ``release``."""

    def __init__(self, inner: StorageBackend, hold: Callable[[int, list[str]], bool]) -> None:
        super().__init__(inner.max_batch)
        self.inner, self.hold, self.gets = inner, hold, 0
        self.name = f"gate({inner.name})"
        self.entered, self.opened = threading.Event(), threading.Event()

    def release(self) -> None:
        self.opened.set()

    def _exists(self, keys: list[str]) -> int:
        return self.inner._exists(keys)

    def _get(self, keys: list[str], max_payload: int = codec.MAX_PAGE_BYTES,
             ) -> list[bytes | memoryview | None]:
        self.gets += 1
        if self.hold(self.gets, keys):
            self.entered.set()
            assert self.opened.wait(20), "gate never released"
        return self.inner._get(keys, max_payload)

    def _put(self, keys: list[str], blobs: list[bytes]) -> list[PageStatus]:
        return self.inner._put(keys, blobs)

    def _delete(self, keys: list[str]) -> list[PageStatus]:
        return self.inner._delete(keys)

    def _clear(self) -> None:
        self.inner._clear()


class Rig:
    """Source content for ``n_pages`` pages (FULL, an SWA window at every page end, a MAMBA
    state at every page end) and destination host pools the controller fills."""

    def __init__(self, root: Path, aux: tuple[str, ...] = (), n_pages: int = 16,
                 seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        layers, heads, hd = SHAPE
        slots = HOST_PAGES * P
        self.n_pages = n_pages
        self.hashes = page_hashes(tokens(n_pages), P)
        self.aux = aux
        self.src: dict[str, HostPages] = {}
        self.dst: dict[str, HostPages] = {}
        self.alloc: dict[str, SlotAllocator] = {}
        for comp in ("full", *aux):
            if comp == "mamba":
                shape: tuple[int, ...] = (slots, *STATE)
                mk = lambda b: HostPages(b, 1, 0)  # noqa: E731
                self.alloc[comp] = SlotAllocator("mamba/host", slots, 1)
            else:
                shape = (layers, 2, slots, heads, hd)
                mk = lambda b: HostPages(b, P, 2)  # noqa: E731
                self.alloc[comp] = SlotAllocator(f"{comp}/host", slots, P)
            self.src[comp] = mk(torch.randn(shape, generator=g).to(torch.bfloat16))
            self.dst[comp] = mk(torch.zeros(shape, dtype=torch.bfloat16))
        self.fp = {c: _fp(h, c) for c, h in self.dst.items()}
        self.store = FileBackend(root / "l3")

    def write(self, backend: StorageBackend | None = None, pages: int | None = None) -> None:
        """Store the first ``pages`` pages of every component (source page i, MAMBA state i
        keyed by page i's hash)."""
        b = backend or self.store
        n = self.n_pages if pages is None else pages
        for comp, host in self.src.items():
            keys = self.fp[comp].keys(self.hashes[:n])
            idx = torch.arange(n * host.page_size, dtype=torch.int64)
            assert b.batch_set(keys, host, idx).all_ok

    def pools(self) -> tuple[PrefetchPool, tuple[PrefetchPool, ...]]:
        full = PrefetchPool("full", self.dst["full"], self.alloc["full"], self.fp["full"])
        aux = tuple(PrefetchPool(c, self.dst[c], self.alloc[c], self.fp[c],
                                 "window" if c == "swa" else "state", WINDOW)
                    for c in self.aux)
        return full, aux

    def controller(self, backend: StorageBackend | None = None,
                   config: PrefetchConfig | None = None, **kw: object) -> PrefetchController:
        full, aux = self.pools()
        cfg = config or PrefetchConfig(threshold_tokens=2 * P, batch_pages=4)
        return PrefetchController(backend or self.store, full, aux, cfg, **kw)  # type: ignore[arg-type]

    def verify(self, r: PrefetchResult) -> None:
        """Every handed-back page equals its source, bit for bit."""
        keep = r.tokens // P
        assert r.page_hashes == self.hashes[:keep]
        full = self.dst["full"]
        for i, first in enumerate(r.full_slots.view(-1, P)[:, 0].tolist() if keep else []):
            assert torch.equal(full.buf[:, :, first:first + P],
                               self.src["full"].buf[:, :, i * P:(i + 1) * P]), f"page {i}"
        for comp, slots in r.aux_slots:
            host, src = self.dst[comp], self.src[comp]
            if comp == "swa":
                w = min(WINDOW, keep)
                assert slots.numel() == w * P
                for j, first in enumerate(slots.view(-1, P)[:, 0].tolist()):
                    s = (keep - w + j) * P
                    assert torch.equal(host.buf[:, :, first:first + P],
                                       src.buf[:, :, s:s + P]), f"swa page {keep - w + j}"
            else:
                assert slots.numel() == (1 if keep else 0)
                if keep:
                    assert torch.equal(host.buf[slots[0]], src.buf[keep - 1])

    def free(self, r: PrefetchResult) -> None:
        if r.full_slots.numel():
            self.alloc["full"].free(r.full_slots)
        for comp, slots in r.aux_slots:
            if slots.numel():
                self.alloc[comp].free(slots)

    def all_free(self) -> bool:
        return all(a.available == a.capacity for a in self.alloc.values())


def drive(ctl: PrefetchController, timeout: float = 10.0) -> list[PrefetchResult]:
    """Poll until something is handed back (and check the controller every step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = ctl.poll()
        ctl.check()
        if out:
            return list(out)
        time.sleep(0.002)
    raise AssertionError("prefetch never handed back")


def settle(ctl: PrefetchController, timeout: float = 10.0) -> None:
    """Poll until nothing is running or draining."""
    deadline = time.monotonic() + timeout
    while ctl._ops or ctl._draining:
        assert time.monotonic() < deadline, "prefetch never settled"
        ctl.poll()
        ctl.check()
        time.sleep(0.002)


def wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.002)
