"""The storage backend interface (L3) and the one place that turns backend failures into values.

A backend stores pages (see ``codec``) under string keys (see ``keys``). Subclasses implement
five small primitives on raw blobs -- ``_exists``, ``_get``, ``_put``, ``_delete``, ``_clear`` --
which may raise; the public batch operations here chunk the keys (``max_batch`` pages a call),
move bytes between the host buffer and the blobs, verify every page read, and turn any
exception into per-page statuses. The cache only ever sees results.

Lifetime and concurrency contract: every public method is thread-safe (backends guard their
own state; the counters here take a lock) and may be called from prefetch / backup worker
threads. ``batch_get`` writes only the host slots it is given, and only pages that arrived whole
and verified; a page it reports as not OK leaves its slots unchanged. ``batch_set`` reads the
host slots during the call only: once it returns, the caller may free or reuse them.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from radixscope.cache.storage import codec
from radixscope.cache.storage.pages import HostPages, as_bytes
from radixscope.cache.storage.results import BatchResult, ExistsResult, PageStatus, StorageStats

MAX_BATCH = 128


def _check_keys(keys: Sequence[str]) -> list[str]:
    if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
        raise TypeError("keys must be a sequence of non-empty str")
    return list(keys)


class StorageBackend(ABC):
    """Batch page store. Subclasses set ``name`` and implement the ``_`` primitives.

    Args:
        max_batch: pages per backend call; larger batches are split.
    """

    name = "backend"

    def __init__(self, max_batch: int = MAX_BATCH) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
        self.max_batch = max_batch
        self._stats_lock = threading.Lock()
        self._calls: dict[str, int] = {}
        self._pages: dict[str, int] = {}
        self._seconds: dict[str, float] = {}
        self._errors: dict[str, int] = {}
        self._bytes = {"get": 0, "set": 0}

    # ---- primitives (may raise; never called by the cache directly) ----
    @abstractmethod
    def _exists(self, keys: list[str]) -> int:
        """Pages present contiguously from ``keys[0]``."""

    @abstractmethod
    def _get(self, keys: list[str],
             max_payload: int = codec.MAX_PAGE_BYTES) -> list[bytes | memoryview | None]:
        """The stored blob of each key, None where absent. ``max_payload``: the page bytes
        the caller expects (a backend that can bound its reads reads no more)."""

    @abstractmethod
    def _put(self, keys: list[str], blobs: list[bytes]) -> list[PageStatus]:
        """Store absent keys (SET NX): OK, EXISTS, or FULL per key."""

    @abstractmethod
    def _delete(self, keys: list[str]) -> list[PageStatus]:
        """OK or MISS per key."""

    @abstractmethod
    def _clear(self) -> None:
        """Remove every page this backend stored (its namespace only)."""

    def _discard(self, keys: list[str]) -> None:  # noqa: B027 -- optional hook
        """Drop pages a read found corrupt, so existence stops reporting them (optional)."""

    def _holding(self) -> tuple[int, int, int]:
        """(stored pages, stored bytes, evicted pages) where known, else -1s."""
        return -1, -1, -1

    def _classify(self, exc: BaseException) -> PageStatus:
        """The status an exception from a primitive stands for."""
        return PageStatus.TIMEOUT if isinstance(exc, TimeoutError) else PageStatus.ERROR

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release connections and files. Idempotent."""

    def probe(self) -> None:  # noqa: B027 -- optional hook
        """Raise ValueError naming the backend when it cannot be reached now (a server that is
        down, a wrong port). The cache never calls it: a live outage is failed pages, counted,
        not an error; a caller that wants a wrong target refused up front (``radixscope run
        --storage``) probes once after opening. Backends opened connected do nothing here."""

    # ---- public operations ----
    def batch_exists(self, keys: Sequence[str]) -> ExistsResult:
        """How many of ``keys`` exist contiguously from the first (stops at the first gap).

        Returns:
            ``ExistsResult``; on a backend failure ``count`` covers the chunks answered before it
            and ``status`` says why the rest is unknown.
        """
        keys = _check_keys(keys)
        t0 = time.perf_counter()
        count, status, err = 0, PageStatus.OK, None
        for i in range(0, len(keys), self.max_batch):
            chunk = keys[i:i + self.max_batch]
            try:
                n = int(self._exists(chunk))
            except Exception as exc:  # noqa: BLE001 -- failures are values
                status, err = self._fail("exists", exc), f"{type(exc).__name__}: {exc}"
                break
            count += max(0, min(n, len(chunk)))
            if n < len(chunk):
                break
        dt = time.perf_counter() - t0
        self._count("exists", (), 0, dt)
        return ExistsResult(count, status, dt, err)

    def batch_set(self, keys: Sequence[str], host: HostPages,
                  host_indices: torch.Tensor) -> BatchResult:
        """Store the pages at ``host_indices`` (whole pages, one per key) under ``keys``.

        Keys already stored are left as they are (``EXISTS``). Reads the host slots during the
        call only. Returns per-page statuses; after a backend failure the remaining pages of the
        call get the same status without being tried.
        """
        keys = _check_keys(keys)
        firsts = self._firsts(keys, host, host_indices)
        t0 = time.perf_counter()
        out: list[PageStatus] = []
        nbytes, err = 0, None
        for i in range(0, len(keys), self.max_batch):
            kc, fc = keys[i:i + self.max_batch], firsts[i:i + self.max_batch]
            if err is not None:
                out += [out[-1]] * len(kc)
                continue
            staging = host.gather(fc)
            blobs = [b"".join((codec.header(k, row), row))
                     for k, row in zip(kc, (as_bytes(staging[j]) for j in range(len(kc))), strict=False)]
            try:
                st = list(self._put(kc, blobs))
                if len(st) != len(kc):
                    raise RuntimeError(f"backend answered {len(st)} statuses for {len(kc)} keys")
            except Exception as exc:  # noqa: BLE001
                st = [self._fail("set", exc)] * len(kc)
                err = f"{type(exc).__name__}: {exc}"
            nbytes += sum(host.page_nbytes for s in st if s is PageStatus.OK)
            out += st
        return self._finish("set", out, nbytes, t0, err)

    def batch_get(self, keys: Sequence[str], host: HostPages,
                  host_indices: torch.Tensor) -> BatchResult:
        """Read ``keys`` into the host pages at ``host_indices`` (whole pages, one per key).

        Only pages that arrive whole, under their own key and with a good checksum are written;
        a short, torn, corrupt or foreign page is reported (``CORRUPT``/``MISMATCH``) and its
        slots are left unchanged. Use ``prefix_ok`` for the usable prefix.
        """
        keys = _check_keys(keys)
        firsts = self._firsts(keys, host, host_indices)
        t0 = time.perf_counter()
        out: list[PageStatus] = []
        nbytes, err = 0, None
        for i in range(0, len(keys), self.max_batch):
            kc, fc = keys[i:i + self.max_batch], firsts[i:i + self.max_batch]
            if err is not None:
                out += [out[-1]] * len(kc)
                continue
            try:
                blobs = list(self._get(kc, host.page_nbytes))
                if len(blobs) != len(kc):
                    raise RuntimeError(f"backend answered {len(blobs)} pages for {len(kc)} keys")
            except Exception as exc:  # noqa: BLE001
                out += [self._fail("get", exc)] * len(kc)
                err = f"{type(exc).__name__}: {exc}"
                continue
            staging = host.staging(len(kc))
            rows = staging.view(torch.uint8).numpy()
            good: list[int] = []
            bad: list[str] = []
            for j, (k, blob) in enumerate(zip(kc, blobs, strict=False)):
                st, payload = codec.decode(k, blob, host.page_nbytes)
                if st is PageStatus.OK:
                    memoryview(rows[j]).cast("B")[:] = payload
                    good.append(j)
                elif st is PageStatus.CORRUPT:
                    bad.append(k)
                out.append(st)
            if bad:
                try:
                    self._discard(bad)
                except Exception as exc:  # noqa: BLE001
                    self._fail("discard", exc)
            if good:
                host.scatter([fc[j] for j in good], staging[good])
                nbytes += len(good) * host.page_nbytes
        return self._finish("get", out, nbytes, t0, err)

    def delete(self, keys: Sequence[str]) -> BatchResult:
        """Remove ``keys``: OK or MISS per key (or the failure)."""
        keys = _check_keys(keys)
        t0 = time.perf_counter()
        out: list[PageStatus] = []
        err = None
        for i in range(0, len(keys), self.max_batch):
            kc = keys[i:i + self.max_batch]
            try:
                out += list(self._delete(kc))
            except Exception as exc:  # noqa: BLE001
                out += [self._fail("delete", exc)] * len(kc)
                err = err or f"{type(exc).__name__}: {exc}"
        return self._finish("delete", out, 0, t0, err)

    def clear(self) -> BatchResult:
        """Remove everything this backend stored. ``statuses`` is ``(OK,)`` or the failure."""
        t0 = time.perf_counter()
        try:
            self._clear()
            st, err = PageStatus.OK, None
        except Exception as exc:  # noqa: BLE001
            st, err = self._fail("clear", exc), f"{type(exc).__name__}: {exc}"
        return self._finish("clear", [st], 0, t0, err)

    def stats(self) -> StorageStats:
        """A copy of the counters (and what the backend holds, where it knows)."""
        try:
            held = self._holding()
        except Exception:  # noqa: BLE001
            held = (-1, -1, -1)
        with self._stats_lock:
            return StorageStats(self.name, dict(self._calls), dict(self._pages),
                                self._bytes["get"], self._bytes["set"], dict(self._seconds),
                                dict(self._errors), *held)

    # ---- helpers ----
    @staticmethod
    def _firsts(keys: list[str], host: HostPages, host_indices: torch.Tensor) -> list[int]:
        if not isinstance(host, HostPages):
            raise TypeError(f"host must be HostPages, got {type(host).__name__}")
        firsts = host.first_slots(host_indices)
        if len(firsts) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(firsts)} host pages")
        return firsts

    def _fail(self, op: str, exc: BaseException) -> PageStatus:
        with self._stats_lock:
            k = f"{op}.{type(exc).__name__}"
            self._errors[k] = self._errors.get(k, 0) + 1
        return self._classify(exc)

    def _finish(self, op: str, statuses: list[PageStatus], nbytes: int, t0: float,
                err: str | None) -> BatchResult:
        dt = time.perf_counter() - t0
        self._count(op, statuses, nbytes, dt)
        return BatchResult(op, tuple(statuses), nbytes, dt, err)

    def _count(self, op: str, statuses: Sequence[PageStatus], nbytes: int, dt: float) -> None:
        with self._stats_lock:
            self._calls[op] = self._calls.get(op, 0) + 1
            self._seconds[op] = self._seconds.get(op, 0.0) + dt
            for s in statuses:
                k = f"{op}.{s.value}"
                self._pages[k] = self._pages.get(k, 0) + 1
            if op in self._bytes:
                self._bytes[op] += nbytes
