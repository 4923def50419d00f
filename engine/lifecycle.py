"""A running request's protocol with the cache, as a serving engine drives SGLang's HiCache.

``prefill_chunk`` allocates FULL/SWA slots (evicting as needed), writes the stand-in model's KV,
inserts the prefilled prefix (whole pages) and moves the request's lock to its new node;
``decode_token`` appends one token (a page when needed; SWA slots that left the window are freed
page-wise and the lock's window released once decode no longer needs it); ``finish`` inserts
prompt + output, donates the MAMBA state, frees what the tree did not take and unlocks;
``retract`` does the same and requeues the request. Admission lives in ``engine.admit``.

Ownership: positions ``[0, cached_len)`` are the tree's (pinned by the request's lock); the
request owns FULL slots from ``cached_len`` and SWA slots from ``max(cached_len,
swa_evicted_len)`` up to the page-aligned capacity it allocated.
"""

from __future__ import annotations

import torch
from opentelemetry import trace

from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.cache.errors import CacheOutOfMemory
from radixscope.cache.keys import ceil_paged
from radixscope.engine.model import StandInModel
from radixscope.engine.request import DECODE, QUEUED, Sequence

_NONE = torch.empty(0, dtype=torch.int64)


class LeakedLock(RuntimeError):
    """A request ended (finished or retracted) while the cache still holds locks it owns.

    Attributes:
        req_id: the request.
        anchors: receipt id -> the anchor node each leaked lock pins.
        rule: the broken rule, for bundles and the UI.
    """

    rule = "lock.released_at_request_end"

    def __init__(self, req_id: str, anchors: dict[int, int]) -> None:
        self.req_id = req_id
        self.anchors = dict(anchors)
        self.nodes = tuple(sorted(set(anchors.values())))
        super().__init__(f"request {req_id} ended but still owns lock(s) "
                         + ", ".join(f"receipt {r} on node {a}" for r, a in anchors.items())
                         + ": nothing will ever release them")


class DecodeBatch:
    """One decode step's model writes: the new position's slots and prefix hash per request."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.full: list[torch.Tensor] = []
        self.swa: list[torch.Tensor] = []
        self.mamba: list[torch.Tensor] = []
        self.rows: list[torch.Tensor] = []

    def add(self, seq: Sequence, p: int) -> None:
        self.full.append(seq.full[p:p + 1])
        if seq.swa.numel():
            self.swa.append(seq.swa[p:p + 1])
        if seq.mamba_slot is not None:
            self.mamba.append(seq.mamba_slot)
        self.rows.append(seq.hashes[p:p + 1])


class Driver:
    """Runs admitted requests against the cache. ``cache`` is the engine's (timed) handle."""

    def __init__(self, cache, model: StandInModel, chunk_tokens: int) -> None:
        self.cache = cache
        self.model = model
        self.chunk_tokens = chunk_tokens
        cfg = cache.config
        self.page = cfg.page_size
        self.swa = WINDOW in cfg.components
        self.mamba = STATE in cfg.components
        self.window = cfg.sliding_window
        self._kv = (BACKBONE, WINDOW) if self.swa else (BACKBONE,)  # also the Sequence attributes
        # branching points filled in by a checkpoint's insert, and MAMBA states kept there
        self.branches_filled = 0
        self.branch_states = 0

    def future(self, seq: Sequence) -> dict[str, int]:
        """Slots ``seq`` will still allocate per KV component (FULL: the rest of its prompt and
        output; SWA: up to its peak, since out-of-window slots are freed and checkpoints hand
        prefilled slots to the tree)."""
        out = {BACKBONE: max(0, ceil_paged(seq.total_len, self.page) - seq.full.numel())}
        if self.swa:
            owned = seq.swa.numel() - max(seq.cached_len, seq.swa_evicted_len)
            out[WINDOW] = max(0, self.swa_peak(seq.phase == DECODE) - max(0, owned))
        return out

    def swa_peak(self, decoding: bool) -> int:
        """Most SWA slots a request owns at once: while prefilling, a chunk plus a partial
        page; while decoding, the window plus two partial pages."""
        if decoding:
            return ceil_paged(self.window, self.page) + 2 * self.page
        return ceil_paged(max(self.chunk_tokens, self.window), self.page) + 2 * self.page

    # ---- prefill / decode ------------------------------------------------------------------
    def _ensure(self, seq: Sequence, upto: int) -> None:
        """Own slots for positions below ``upto`` (whole pages; evicts as needed)."""
        c, rid = self.cache, seq.rid
        need = upto - seq.full.numel()
        if need > 0:
            seq.full = torch.cat([seq.full, c.alloc(need, req_id=rid)])
        if self.swa:
            need = upto - seq.swa.numel()
            if need > 0:
                seq.swa = torch.cat([seq.swa, c.alloc(need, component=WINDOW, req_id=rid)])
        if self.mamba and seq.mamba_slot is None:
            seq.mamba_slot = c.alloc(1, component=STATE, req_id=rid)

    def _write(self, seq: Sequence, s: int, e: int) -> None:
        h = seq.hashes[s:e]
        self.model.write_kv(self.cache, BACKBONE, seq.full[s:e], h)
        if self.swa:
            self.model.write_kv(self.cache, WINDOW, seq.swa[s:e], h)
        if self.mamba:
            self.model.write_state(self.cache, seq.mamba_slot, seq.hashes[e - 1])
        seq.seq_len = e

    def prefill_chunk(self, seq: Sequence, limit: int) -> int:
        """Prefill up to ``min(limit, chunk_tokens)`` prompt tokens; returns how many.
        Raises ``CacheOutOfMemory`` (with the request unchanged but for whole pages it now
        owns) when no room can be made."""
        s = seq.seq_len
        e = min(seq.prompt_len, s + min(limit, self.chunk_tokens))
        with trace.use_span(seq.span, end_on_exit=False):
            self._ensure(seq, e)
            self._write(seq, s, e)
            seq.chunks += 1
            self._checkpoint(seq)
            self._slide_window(seq)
        if e == seq.prompt_len:
            seq.phase = DECODE
        return e - s

    def reserve_decode(self, seqs: list[Sequence]) -> None:
        """Allocate a decode step's new slots for all of ``seqs`` with one ``alloc`` per KV
        component, as a batched scheduler does (SGLang's ``alloc_for_decode``: one call for the
        whole batch), and hand each request its whole pages. When a component's total does not
        fit (more than free + evictable slots), nothing is allocated for it here: each
        request's ``decode_token`` then allocates its own and the ones that cannot are stalled,
        as before. A batch of one request keeps its ``req_id`` and span."""
        if not seqs:
            return
        c = self.cache
        for comp in self._kv:
            needs = []
            for seq in seqs:
                short = seq.seq_len + 1 - getattr(seq, comp).numel()
                if short > 0:
                    needs.append((seq, ceil_paged(short, self.page)))
            total = sum(n for _, n in needs)
            if not total or total > c.available(comp) + c.evictable_slots(comp):
                continue  # nothing to do, or each decode_token allocates its own
            try:
                if len(needs) == 1:
                    seq = needs[0][0]
                    with trace.use_span(seq.span, end_on_exit=False):
                        slots = c.alloc(total, component=comp, req_id=seq.rid)
                else:
                    slots = c.alloc(total, component=comp)
            except CacheOutOfMemory:
                continue
            for (seq, _), part in zip(needs, slots.split([n for _, n in needs]), strict=True):
                setattr(seq, comp, torch.cat([getattr(seq, comp), part]))

    def decode_token(self, seq: Sequence, batch: DecodeBatch | None = None) -> None:
        """Append one output token (teacher-forced from the spec). With ``batch``, the model's
        writes are gathered there and applied by ``flush`` (one write per component for the
        whole decode step, as a batched forward pass would)."""
        p = seq.seq_len
        with trace.use_span(seq.span, end_on_exit=False):
            self._ensure(seq, p + 1)
            if batch is None:
                self._write(seq, p, p + 1)
            else:
                batch.add(seq, p)
                seq.seq_len = p + 1
            self._slide_window(seq)

    def flush(self, batch: DecodeBatch) -> None:
        """Apply a decode step's gathered writes."""
        if not batch.rows:
            return
        h = torch.cat(batch.rows)
        self.model.write_kv(self.cache, BACKBONE, torch.cat(batch.full), h)
        if self.swa:
            self.model.write_kv(self.cache, WINDOW, torch.cat(batch.swa), h)
        if self.mamba:
            self.model.write_states(self.cache, torch.cat(batch.mamba), h)
        batch.clear()

    def _slide_window(self, seq: Sequence) -> None:
        """SWA: free own slots that left the window (whole pages); release the lock's window once
        decode no longer needs the tree's part of it."""
        if not self.swa:
            return
        c = self.cache
        new_ev = max(0, seq.seq_len - self.window) // self.page * self.page
        lo = max(seq.swa_evicted_len, seq.cached_len)
        if new_ev > lo:
            c.free(seq.swa[lo:new_ev], component=WINDOW, req_id=seq.rid)
            swa = seq.swa.clone()
            swa[lo:new_ev] = -1
            seq.swa = swa
        seq.swa_evicted_len = max(seq.swa_evicted_len, new_ev)
        r = seq.receipt
        if (r is not None and not r.swa_released and seq.seq_len - self.window + 1 >= seq.cached_len
                and any(comp == WINDOW and nodes for comp, nodes in r.pins)):
            seq.receipt = c.release_swa(r, req_id=seq.rid)

    def _insert(self, seq: Sequence, mamba_slot, branch: int = 0, branch_slot=None) -> object:
        e = seq.seq_len
        kw: dict = {}
        if self.swa:
            kw = {"swa_indices": seq.swa[:e], "swa_evicted_len": seq.swa_evicted_len}
        if branch_slot is not None:
            kw["mamba_branch_slot"] = branch_slot
        return self.cache.insert(seq.key[:e], seq.full[:e], extra_key=seq.spec.extra_key,
                                 mamba_slot=mamba_slot, prev_prefix_len=seq.cached_len,
                                 branch_len=branch, req_id=seq.rid, **kw)

    def _checkpoint(self, seq: Sequence) -> None:
        """Insert the prefilled prefix (whole pages) and move the lock to its node. The first
        checkpoint that reaches the request's branching point fills it in: the SWA window behind
        it (still the request's) and, with MAMBA, the state there (when a slot is free)."""
        c = self.cache
        aligned = seq.seq_len // self.page * self.page
        if aligned <= seq.cached_len:
            return
        fork = None
        if self.mamba and c.available(STATE) > 0:  # fork the state; skip when no free slot
            fork = c.alloc(1, component=STATE, req_id=seq.rid)
            self.model.write_state(c, fork, seq.hashes[aligned - 1])
        branch = seq.branch_len if seq.branch_len <= aligned else 0
        if branch:
            seq.branch_len = 0
        at = None
        if branch and self.mamba and branch < aligned and c.available(STATE) > 0:
            at = c.alloc(1, component=STATE, req_id=seq.rid)
            self.model.write_state(c, at, seq.hashes[branch - 1])
        res = self._insert(seq, fork, branch, at)
        if branch and res.branch_node is not None:
            self.branches_filled += 1
            self.branch_states += at is not None and not res.mamba_branch_exist
        new = c.lock(res.last_node, owner=seq.rid, req_id=seq.rid)
        if seq.receipt is not None:
            c.unlock(seq.receipt, req_id=seq.rid)
        seq.receipt = new
        seq.anchor = res.last_node
        tree = c.path_indices(res.last_node)
        if tree.numel() != aligned:
            raise RuntimeError(f"request {seq.rid}: the tree's path to node {res.last_node} "
                               f"has {tree.numel()} slots, expected {aligned}")
        seq.full = torch.cat([tree, seq.full[aligned:]])
        if self.swa:
            swa = seq.swa.clone()
            swa[:aligned] = -1
            seq.swa = swa
        seq.cached_len = aligned

    # ---- end of a request --------------------------------------------------------------------
    def _release(self, seq: Sequence) -> None:
        """Cache what was computed, free the rest, unlock."""
        c, rid = self.cache, seq.rid
        aligned = seq.seq_len // self.page * self.page
        slot, seq.mamba_slot = seq.mamba_slot, None
        if slot is not None and 0 < aligned < seq.seq_len:
            self.model.write_state(c, slot, seq.hashes[aligned - 1])  # the page-boundary state
        if slot is not None and seq.seq_len == 0:
            c.free(slot, component=STATE, req_id=rid)
            slot = None
        self._insert(seq, slot)
        if seq.full.numel() > aligned:
            c.free(seq.full[aligned:], component=BACKBONE, req_id=rid)
        if self.swa:
            lo = max(aligned, seq.swa_evicted_len, seq.cached_len)
            if seq.swa.numel() > lo:
                c.free(seq.swa[lo:], component=WINDOW, req_id=rid)
        if seq.receipt is not None:
            c.unlock(seq.receipt, req_id=rid)
        seq.receipt = None
        seq.full = seq.swa = _NONE
        leaked = c.locks_owned_by(rid)
        if leaked:
            raise LeakedLock(rid, {r: c.locks[r].anchor for r in leaked})

    def finish(self, seq: Sequence) -> None:
        with trace.use_span(seq.span, end_on_exit=False):
            self._release(seq)

    def retract(self, seq: Sequence) -> None:
        """Give the request's memory back (its progress stays cached) and requeue it."""
        with trace.use_span(seq.span, end_on_exit=False):
            self._release(seq)
        seq.retractions += 1
        seq.phase = QUEUED
        seq.seq_len = seq.cached_len = seq.swa_evicted_len = seq.branch_len = 0


__all__ = ["Driver", "DecodeBatch", "LeakedLock"]
