"""Running transfers: a side CUDA stream with events and pinned staging, or deferred CPU
copies that run when asked (``poll``, or a reader that needs them). The engine holds what is
in flight; the cache (``transfers.Transfers``) decides what to copy and acks it."""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from radixscope.cache import events as ev
from radixscope.cache.results import Transfer
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import Tier


def _tier(name: str) -> Tier:
    return Tier.of(name)


class _Pending:
    """A submitted transfer not yet acked: its CUDA event (None on CPU), staging buffers, and
    whether its copies have run (CPU: at ``poll``, or earlier when a reader needed them)."""

    __slots__ = ("transfer", "event", "started", "nbytes", "staging", "ran")

    def __init__(self, transfer: Transfer, event, started: int, nbytes: int, staging) -> None:
        self.transfer = transfer
        self.event = event
        self.started = started
        self.nbytes = nbytes
        self.staging = staging
        self.ran = False


class TransferEngine:
    """Runs transfers: a side CUDA stream with events, or deferred CPU copies."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self.pending: OrderedDict[int, _Pending] = OrderedDict()

    def submit(self, core: CacheCore, t: Transfer) -> None:
        if not self.cuda:
            self.pending[t.transfer_id] = _Pending(t, None, 0, 0, None)
            return
        started = time.time_ns()
        self.stream.wait_stream(torch.cuda.current_stream())
        staging = []
        nbytes = 0
        with torch.cuda.stream(self.stream):
            for c in t.copies:
                src = core.pool(core.ci[c.component], _tier(c.src_tier))
                dst = core.pool(core.ci[c.component], _tier(c.dst_tier))
                dim = 2 if src.buf.dim() == 5 else 0
                nbytes += c.src.numel() * src.bytes_per_slot
                if c.src_tier == ev.TIER_DEVICE and c.dst_tier == ev.TIER_HOST:
                    # gather on device, land in pinned staging
                    data = src.buf.index_select(dim, c.src.to(src.buf.device, non_blocking=True))
                    host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
                    host.copy_(data, non_blocking=True)
                    staging.append((dst, dim, c.dst, host))
                elif c.src_tier == ev.TIER_DEVICE:  # device -> device (a CoW state copy)
                    data = src.buf.index_select(dim, c.src.to(src.buf.device, non_blocking=True))
                    dst.buf.index_copy_(dim, c.dst.to(dst.buf.device, non_blocking=True), data)
                    staging.append((None, dim, None, data))
                else:  # gather on host into pinned memory, scatter on device
                    data = src.buf.index_select(dim, c.src).pin_memory()
                    dev = data.to(dst.buf.device, non_blocking=True)
                    dst.buf.index_copy_(dim, c.dst.to(dst.buf.device, non_blocking=True), dev)
                    staging.append((None, dim, None, data))
        event = torch.cuda.Event()
        event.record(self.stream)
        self.pending[t.transfer_id] = _Pending(t, event, started, nbytes, staging)

    def make_ready(self, core: CacheCore, tid: int) -> None:
        """Make transfer ``tid``'s device writes visible to work the caller issues next, without
        acking it. CPU: run its copies now (once). CUDA: the caller's current stream waits on
        the transfer's event (no host sync)."""
        p = self.pending[tid]
        if p.event is None:
            if not p.ran:
                p.started = time.time_ns()
                p.nbytes = self.run_cpu(core, p.transfer)
                p.ran = True
        else:
            torch.cuda.current_stream().wait_event(p.event)

    def collect(self, core: CacheCore, ids: list[int] | None, wait: bool) -> list[tuple]:
        """Finished transfers as (transfer, started_ns, bytes), removed from pending."""
        order = list(self.pending) if ids is None else ids
        done = []
        for tid in order:
            p = self.pending[tid]
            if p.event is None:
                if not p.ran:
                    p.started = time.time_ns()
                    p.nbytes = self.run_cpu(core, p.transfer)
            else:
                if not wait and not p.event.query():
                    continue
                p.event.synchronize()
                for dst, dim, idx, host in p.staging:
                    if dst is not None:
                        dst.buf.index_copy_(dim, idx, host)
            del self.pending[tid]
            done.append((p.transfer, p.started, p.nbytes))
        return done

    @staticmethod
    def run_cpu(core: CacheCore, t: Transfer) -> int:
        """Run a transfer's copies now, on the CPU; returns the bytes copied."""
        nbytes = 0
        for c in t.copies:
            ci = core.ci[c.component]
            src, dst = core.pool(ci, _tier(c.src_tier)), core.pool(ci, _tier(c.dst_tier))
            dim = 2 if src.buf.dim() == 5 else 0
            dst.buf.index_copy_(dim, c.dst, src.buf.index_select(dim, c.src))
            nbytes += c.src.numel() * src.bytes_per_slot
        return nbytes


__all__ = ["TransferEngine"]
