"""Staged copies: a transfer made of many tiny runs of slots, moved as a few large copies
through pinned staging memory instead of one DMA a run.

Why: a run copies as one DMA (``copy_runs``), and a DMA costs about 2 us to set up whatever
it moves. Runs of a few hundred bytes (a small model's KV, page size 1, slots scattered by
churn) then copy at a small fraction of the bus (bench/RESULTS.md: 75,586 DMAs for 32 MB at
0.1 GB/s). A staged copy costs a gather, one bulk copy and a scatter, whatever the runs: its
price is bytes (the CPU gathers or scatters them at some 10 GB/s), a run's price is that
setup. ``copy_path`` picks, per component copy, by the mean bytes a run: below
``STAGED_BELOW_BYTES`` (32 KiB) a copy goes staged. On an H200 (bench/RESULTS.md, third GPU
session; ``bash bench/gpu_crossover.sh``) the staged path wins 2-14x by wall time below 32 KiB
and 1.1-2.5x at 48 KiB; at 64 KiB its load-back falls to a third of a DMA a run. That fall is
the CPU gather: ``index_select`` splits across fewer threads once a slot reaches 32,768
elements (ATen's grain size), so a higher threshold would send fp8 KV over it.

A transfer's staged copies share one pinned slab (``StagingSlabs``) laid out as each copy's
index list (int64) and data, 64-byte aligned (``Stage``):
- backup (device -> host): one upload of the index lists, a gather on the device
  (``index_select``) into a device slab, one download into the pinned slab; the scatter into
  the host pool runs on the CPU once the transfer's event has completed (``Stage.finish``);
- load-back (host -> device): the CPU gathers from the host pool into the pinned slab, one
  upload of it, and ``index_copy_`` into the device pool on the stream.
The copies are enqueued on the current stream (the engine's side stream). The slab is handed
back only after the event that follows them has completed: no slab is written while a copy into
or out of it may be in flight, however many transfers are.

Everything here is plain torch on any device, so the CPU tests run the same code with
``pin=False`` and the device ``cpu``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

STAGED_BELOW_BYTES = 32 * 1024  # a copy whose runs average fewer bytes goes staged
RUNS, STAGED = "runs", "staged"  # the paths a copy can take (``copy_path``)
_ALIGN = 64  # bytes: a region's offset in a slab (any dtype can view it)
_MIN_SLAB = 1 << 16  # bytes: the smallest slab made


def copy_path(table: np.ndarray, bytes_per_slot: int, staged_below: int) -> str:
    """``STAGED`` when the runs of ``table`` (``copy_runs.runs``'s rows) average fewer than
    ``staged_below`` bytes (``bytes_per_slot`` a slot), else ``RUNS`` (an empty table too:
    nothing to copy)."""
    k = len(table)
    if k == 0:
        return RUNS
    slots = int(table[:, 2].sum())
    return STAGED if slots * bytes_per_slot < staged_below * k else RUNS


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class StagingSlabs:
    """Pinned byte slabs for staged copies, reused across transfers.

    ``take`` hands out the smallest free slab that fits (a new one, a little larger than asked, when
    none does); ``give`` takes it back, which the caller does only once no copy into or out of it
    can still run. So each transfer in flight holds its own slab and pinning (slow) happens only
    when the set grows. At most ``keep`` free slabs are kept (the smallest go first).

    Args:
        pin: pin the slabs (CUDA); False on the CPU.
        keep: free slabs kept for reuse.
    """

    def __init__(self, pin: bool, keep: int = 8) -> None:
        self.pin = pin
        self.keep = keep
        self.free: list[torch.Tensor] = []
        self.made = 0  # slabs allocated (pinned) so far

    def take(self, nbytes: int) -> torch.Tensor:
        fits = [i for i, s in enumerate(self.free) if s.numel() >= nbytes]
        if fits:
            return self.free.pop(min(fits, key=lambda i: self.free[i].numel()))
        self.made += 1
        q = 1 << max(nbytes.bit_length() - 3, 0)  # round up by at most an eighth
        size = max(_MIN_SLAB, -(-nbytes // q) * q)
        return torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)

    def give(self, slab: torch.Tensor) -> None:
        self.free.append(slab)
        if len(self.free) > self.keep:
            del self.free[min(range(len(self.free)), key=lambda i: self.free[i].numel())]


def _carve(slab: torch.Tensor, off: int, shape: tuple[int, ...], dtype: torch.dtype
           ) -> torch.Tensor:
    """The contiguous ``shape`` x ``dtype`` view of ``slab`` (bytes) at byte ``off``."""
    n = math.prod(shape) * dtype.itemsize
    return slab[off:off + n].view(dtype).view(shape)


def _select_into(buf: torch.Tensor, dim: int, idx: torch.Tensor, out: torch.Tensor) -> None:
    """``index_select`` into ``out`` (a view of a slab), which it must not reallocate."""
    ptr = out.data_ptr()
    torch.index_select(buf, dim, idx, out=out)
    if out.data_ptr() != ptr:
        raise RuntimeError(f"index_select reallocated its output {tuple(out.shape)}")


class _Job:
    """One component copy of a stage: pool buffers, slot lists (CPU int64), slab offsets."""

    __slots__ = ("src", "dst", "dim", "src_idx", "dst_idx", "shape", "idx_off", "data_off")

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, dim: int, src_idx: torch.Tensor,
                 dst_idx: torch.Tensor) -> None:
        self.src, self.dst, self.dim = src, dst, dim
        self.src_idx = src_idx.to("cpu", torch.int64)
        self.dst_idx = dst_idx.to("cpu", torch.int64)
        shape = list(src.shape)
        shape[dim] = self.src_idx.numel()
        self.shape = tuple(shape)
        self.idx_off = self.data_off = 0


class Stage:
    """A transfer's staged copies, all one way: ``add`` each, then ``start`` (enqueue on the
    current stream), then ``finish`` once the stream has passed them (the transfer's event).

    Args:
        to_host: True for device -> host (backup), False for host -> device (load-back).
    """

    def __init__(self, to_host: bool) -> None:
        self.to_host = to_host
        self.jobs: list[_Job] = []
        self.slab: torch.Tensor | None = None
        self.keep: list[torch.Tensor] = []  # device memory the enqueued copies use

    def add(self, src: torch.Tensor, dst: torch.Tensor, dim: int, src_idx: torch.Tensor,
            dst_idx: torch.Tensor) -> None:
        """Stage a copy of slots ``src_idx`` of pool buffer ``src`` into ``dst_idx`` of
        ``dst`` (same geometry; slots along ``dim``)."""
        self.jobs.append(_Job(src, dst, dim, src_idx, dst_idx))

    def _layout(self) -> tuple[int, int]:
        """Offsets: every index list first, then every copy's data. Returns (bytes of the
        index lists, bytes in all)."""
        off = 0
        for j in self.jobs:
            j.idx_off = off
            off += _aligned(j.src_idx.numel() * 8)
        idx_bytes = off
        for j in self.jobs:
            j.data_off = off
            off += _aligned(math.prod(j.shape) * j.src.element_size())
        return idx_bytes, off

    def start(self, slabs: StagingSlabs, device: torch.device) -> None:
        """Take a slab and enqueue the copies on the current stream of ``device`` (the
        device pools'): the host side's gathers run now, on the CPU."""
        idx_bytes, total = self._layout()
        slab = self.slab = slabs.take(total)
        if self.to_host:
            for j in self.jobs:  # the device gathers these: upload them with the slab
                _carve(slab, j.idx_off, (j.src_idx.numel(),), torch.int64).copy_(j.src_idx)
            dev = torch.empty(total, dtype=torch.uint8, device=device)
            dev[:idx_bytes].copy_(slab[:idx_bytes], non_blocking=True)
            for j in self.jobs:
                idx = _carve(dev, j.idx_off, (j.src_idx.numel(),), torch.int64)
                _select_into(j.src, j.dim, idx, _carve(dev, j.data_off, j.shape, j.src.dtype))
            slab[idx_bytes:total].copy_(dev[idx_bytes:total], non_blocking=True)
        else:
            for j in self.jobs:  # gather from the host pool; the device scatters to these
                _carve(slab, j.idx_off, (j.dst_idx.numel(),), torch.int64).copy_(j.dst_idx)
                _select_into(j.src, j.dim, j.src_idx,
                             _carve(slab, j.data_off, j.shape, j.src.dtype))
            dev = torch.empty(total, dtype=torch.uint8, device=device)
            dev.copy_(slab[:total], non_blocking=True)
            for j in self.jobs:
                idx = _carve(dev, j.idx_off, (j.dst_idx.numel(),), torch.int64)
                j.dst.index_copy_(j.dim, idx, _carve(dev, j.data_off, j.shape, j.dst.dtype))
        self.keep.append(dev)

    def finish(self, slabs: StagingSlabs) -> None:
        """After the stream passed the copies (the caller waited on the transfer's event):
        scatter a backup's data into the host pool (CPU), give the slab back. Once."""
        slab, self.slab = self.slab, None
        if slab is None:
            return
        if self.to_host:
            for j in self.jobs:
                j.dst.index_copy_(j.dim, j.dst_idx, _carve(slab, j.data_off, j.shape, j.dst.dtype))
        self.keep.clear()
        slabs.give(slab)


__all__ = ["STAGED_BELOW_BYTES", "RUNS", "STAGED", "copy_path", "StagingSlabs", "Stage"]
