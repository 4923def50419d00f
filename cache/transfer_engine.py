"""Running transfers: copies on a side CUDA stream with events, or deferred CPU copies that
run when asked (``poll``, or a reader that needs them). The engine holds what is in flight;
the cache (``transfers.Transfers``) decides what to copy and acks it.

Under CUDA each component copy between the device and the (pinned) host pool takes one of two
paths, chosen by the mean bytes a run of slots consecutive on both sides (``staged.copy_path``
against ``staged_below``):
- runs (``copy_runs``): one DMA per run, no gather and no CPU copy, so a transfer of long runs
  moves at the speed of a plain pinned copy of the same bytes (bench/bench_gpu.py);
- staged (``staged``): a gather, one bulk copy through a reused pinned slab, a scatter; a
  backup's scatter into the host pool runs on the CPU at the ack, once the event has
  completed. Few copies whatever the fragmentation: for runs too short to pay a DMA each.
A device-to-device copy (a MAMBA copy-on-write) gathers and scatters on the stream. Each CUDA
transfer is timed by a pair of events on the side stream: the ack reports the copies' own time
on the stream (``ev.A_COPY_NS``; a staged backup's CPU scatter is not in it) beside its
submit-to-ack span."""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from radixscope.cache import events as ev
from radixscope.cache.copy_runs import Memcpy2D, Rows, check_pair, copy_rows, runs
from radixscope.cache.pools import KVPool, StatePool
from radixscope.cache.results import Transfer
from radixscope.cache.staged import RUNS, STAGED, STAGED_BELOW_BYTES, Stage, StagingSlabs, copy_path
from radixscope.cache.state import CacheCore
from radixscope.cache.tiers import Tier


def _tier(name: str) -> Tier:
    return Tier.of(name)


class _Pending:
    """A submitted transfer not yet acked: its CUDA events (None on CPU: ``begin`` recorded
    before its copies, ``event`` after), the gathered data a CoW copy scatters from (kept
    until ``event``), its staged copies (their slab held until ``event``; a backup's scatter
    still to run), and whether its copies have run (CPU: at ``poll``, or earlier when a
    reader needed them)."""

    __slots__ = ("transfer", "event", "begin", "started", "nbytes", "keep", "stages", "ran")

    def __init__(self, transfer: Transfer, event: torch.cuda.Event | None, started: int,
                 nbytes: int, keep: list[torch.Tensor] | None = None,
                 begin: torch.cuda.Event | None = None, stages: tuple[Stage, ...] = ()
                 ) -> None:
        self.transfer = transfer
        self.event = event
        self.begin = begin
        self.started = started
        self.nbytes = nbytes
        self.keep = keep
        self.stages = stages
        self.ran = False

    def copy_ns(self) -> int | None:
        """The copies' time on the side stream (CUDA, once ``event`` completed), else None."""
        if self.begin is None:
            return None
        return int(self.begin.elapsed_time(self.event) * 1e6)


class TransferEngine:
    """Runs transfers: copies on a side CUDA stream with events, or deferred CPU copies.

    ``staged_below`` (bytes, default ``STAGED_BELOW_BYTES``): a CUDA copy whose runs average
    fewer bytes goes staged (0: never; a bench or test may set it). ``copies`` counts the
    CUDA copies per path (``RUNS``, ``STAGED``)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self.pending: OrderedDict[int, _Pending] = OrderedDict()
        # the runtime's 2-D copy (one DMA a run); None: one copy_ per row of a run instead
        self.memcpy2d = Memcpy2D.load(device) if self.cuda else None
        self._rows: dict[int, Rows] = {}  # id(pool) -> its buffer's geometry
        self.staged_below = STAGED_BELOW_BYTES
        self.slabs = StagingSlabs(pin=self.cuda)  # pinned staging, reused across transfers
        self.copies = {RUNS: 0, STAGED: 0}

    def rows(self, pool: KVPool | StatePool) -> Rows:
        """``pool``'s buffer as rows x slots (cached: a pool keeps its buffer)."""
        r = self._rows.get(id(pool))
        if r is None or r.buf is not pool.buf:
            r = self._rows[id(pool)] = Rows(pool.buf, pool.slot_dim)
        return r

    def check_pools(self, core: CacheCore) -> None:
        """Raise unless each component's device and host pools copy as runs (contiguous, the
        same rows): when the cache is built, not at its first transfer."""
        for ci in range(len(core.comps)):
            pools = [p for p in core.pools[ci] if p is not None]
            for p in pools[1:]:
                check_pair(self.rows(pools[0]), self.rows(p))

    def __del__(self) -> None:
        # a cache dropped with copies in flight: they finish before the pinned host buffers
        # (freed with the pools) can be handed to another allocation; the raw 2-D copies are
        # not fenced by torch's pinned-memory allocator as its own copies are
        for p in getattr(self, "pending", {}).values():
            if p.event is not None:
                try:
                    p.event.synchronize()
                except Exception:  # noqa: BLE001 - a finalizer: nothing to raise to
                    return

    def submit(self, core: CacheCore, t: Transfer) -> None:
        if not self.cuda:
            self.pending[t.transfer_id] = _Pending(t, None, 0, 0)
            return
        started = time.time_ns()
        stream = self.stream
        # what the compute wrote, first (the current stream of the pools' device, not of the
        # current device: cuda:N)
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        begin = torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        keep = []
        nbytes = 0
        stages: dict[bool, Stage] = {}  # to host? -> its staged copies
        with torch.cuda.stream(stream):
            for c in t.copies:
                src = core.pool(core.ci[c.component], _tier(c.src_tier))
                dst = core.pool(core.ci[c.component], _tier(c.dst_tier))
                nbytes += c.src.numel() * src.bytes_per_slot
                if c.src_tier == ev.TIER_DEVICE and c.dst_tier == ev.TIER_DEVICE:
                    # a CoW state copy: gather and scatter on the device
                    dim = src.slot_dim
                    data = src.buf.index_select(dim, c.src.to(src.buf.device, non_blocking=True))
                    dst.buf.index_copy_(dim, c.dst.to(dst.buf.device, non_blocking=True), data)
                    keep.append(data)
                    continue
                sr, dr = self.rows(src), self.rows(dst)
                check_pair(sr, dr)
                table = runs(c.src, c.dst)
                path = copy_path(table, src.bytes_per_slot, self.staged_below)
                self.copies[path] += 1
                if path == STAGED:  # one stage a direction (a transfer goes one way)
                    to_host = c.dst_tier == ev.TIER_HOST
                    stage = stages.get(to_host)
                    if stage is None:
                        stage = stages[to_host] = Stage(to_host)
                    stage.add(src.buf, dst.buf, src.slot_dim, c.src, c.dst)
                elif self.memcpy2d is not None:
                    self.memcpy2d.copy(sr, dr, table, stream.cuda_stream)
                else:
                    copy_rows(sr, dr, table)
            for stage in stages.values():
                stage.start(self.slabs, stream.device)
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        self.pending[t.transfer_id] = _Pending(t, event, started, nbytes, keep, begin,
                                               tuple(stages.values()))

    def make_ready(self, core: CacheCore, tid: int) -> None:
        """Make transfer ``tid``'s writes visible to work the caller issues next, without
        acking it. CPU: run its copies now (once). CUDA: the caller's current stream waits on
        the transfer's event (no host sync); a backup with staged copies also waits on the
        host for the event and scatters into the host pool now (the cache calls this for
        load-backs only; a backup's host data is read after its ack)."""
        p = self.pending[tid]
        if p.event is None:
            if not p.ran:
                p.started = time.time_ns()
                p.nbytes = self.run_cpu(core, p.transfer)
                p.ran = True
            return
        torch.cuda.current_stream(self.stream.device).wait_event(p.event)
        if any(s.to_host for s in p.stages):
            p.event.synchronize()
            for s in p.stages:
                if s.to_host:
                    s.finish(self.slabs)

    def collect(self, core: CacheCore, ids: list[int] | None, wait: bool) -> list[tuple]:
        """Finished transfers as (transfer, started_ns, bytes, copy_ns or None), removed from
        pending."""
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
                for s in p.stages:
                    s.finish(self.slabs)  # a backup's scatter; the slab goes back
            del self.pending[tid]
            done.append((p.transfer, p.started, p.nbytes, p.copy_ns()))
        return done

    @staticmethod
    def run_cpu(core: CacheCore, t: Transfer) -> int:
        """Run a transfer's copies now, on the CPU; returns the bytes copied."""
        nbytes = 0
        for c in t.copies:
            ci = core.ci[c.component]
            src, dst = core.pool(ci, _tier(c.src_tier)), core.pool(ci, _tier(c.dst_tier))
            dim = src.slot_dim
            dst.buf.index_copy_(dim, c.dst, src.buf.index_select(dim, c.src))
            nbytes += c.src.numel() * src.bytes_per_slot
        return nbytes


__all__ = ["TransferEngine"]
