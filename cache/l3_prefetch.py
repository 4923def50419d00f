"""The L3 tier's read path: prefetch on match, hand-back on poll, abort.

A mixin of ``HiRadixCache`` (active only with storage). ``match_prefix(..., req_id=R,
prefetch=True)`` hashes the whole pages past the host match (chained from the last host node's
last page hash) and starts a prefetch for ``R`` (``PrefetchController.start``), host-pinning
that node (owner ``prefetch:R``) while it runs. Each ``poll()`` polls the controller (a
collective with several ranks); every result becomes host-only nodes under the pinned node:
FULL pages, the SWA window and the MAMBA state on the last node (split so SWA values stay one
paged window), each with STORAGE values (they came from L3) when the anchor is stored; pages
already in the tree meanwhile are freed, not duplicated. One ``prefetch`` op record per
hand-back (and per abort).
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import torch

from radixscope.cache import events as ev
from radixscope.cache.components import STATE, WINDOW
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.results import MatchResult, StorageMatchResult
from radixscope.cache.state import CacheCore
from radixscope.cache.storage import prefetch_events as pe
from radixscope.cache.storage.prefetch_op import PrefetchResult
from radixscope.cache.storage.setup import PrefetchState
from radixscope.cache.storage.stored import StoredPages
from radixscope.cache.tiers import DEVICE, HOST, STORAGE
from radixscope.cache.tree import Node

PREFETCH_OWNER = "prefetch:"
DONE_KEPT = 4096  # finished prefetch states kept for prefetch_state / storage_hit_length


@dataclass
class _Running:
    req_id: str
    anchor: int
    receipt: int | None
    start_len: int
    tokens: array
    extra_key: object
    asked: int
    started_ns: int


class StoragePrefetch(CacheCore):
    """Prefetch start / hand-back / abort and their queries: methods of ``HiRadixCache``."""

    def _init_prefetch_state(self) -> None:
        self._pf: dict[str, _Running] = {}
        self._pf_done: OrderedDict[str, PrefetchState] = OrderedDict()
        self._pf_attrs: dict = {}

    # ---- start (inside the match op) -------------------------------------------------------
    def _match_prefetch(self, tokens, extra_key, cow: bool, req_id: str) -> MatchResult:
        m = self._match(tokens, extra_key, cow)
        run = self._pf.get(req_id)
        if run is not None:
            return StorageMatchResult.of(m, "ongoing", run.asked)
        done = self._pf_done.get(req_id)
        if done is not None:
            lo = max(done.start_len, m.device_prefix_len)
            hi = min(done.start_len + done.hit_tokens, m.best_prefix_len)
            return StorageMatchResult.of(m, "done", done.asked_tokens, max(0, hi - lo))
        anchor = self.tree.nodes[m.best_match_node]
        setup = self.storage
        if (setup.write_policy == "write_through_selective" and anchor.parent is not None
                and anchor.hit_count >= setup.write_threshold
                and anchor.data[0].values[STORAGE] is None):
            self._store_wanted[anchor.id] = None  # it got hot after its backup: store it now
        start = self.tree.prefix_len(anchor)
        rest = tokens[start:m.key_len]
        hashes = self._hashes_after(anchor, rest, extra_key)
        rid = None
        if anchor.parent is not None:  # pin first: finding host room must not evict it
            pins = {c.index: [anchor] for c in self.comps
                    if c.index == 0 or anchor.data[c.index].values[HOST] is not None}
            rid = self.acquire(anchor, HOST, pins, f"{PREFETCH_OWNER}{req_id}")
        try:
            r = self.prefetcher.start(req_id, hashes)
        except BaseException:  # a failed collective, bad hashes: the anchor pin goes with it
            if rid is not None:
                self.release(self.locks[rid])
            raise
        if not r.started:
            if rid is not None:
                self.release(self.locks[rid])
            return StorageMatchResult.of(m, r.reason, r.tokens)
        self._pf[req_id] = _Running(req_id, anchor.id, rid, start, rest[:r.tokens], extra_key,
                                    r.tokens, time.time_ns())
        return StorageMatchResult.of(m, "started", r.tokens)

    # ---- queries -----------------------------------------------------------------------------
    def prefetch_state(self, req_id: str) -> PrefetchState | None:
        """``req_id``'s prefetch (running, or among the last finished ones), or None.
        Read-only."""
        if self.storage is None:
            return None
        run = self._pf.get(req_id)
        if run is not None:
            return self._running_state(run)
        return self._pf_done.get(req_id)

    def pending_prefetches(self) -> list[PrefetchState]:
        """Every running prefetch, in start order (bundles, the doctor). Read-only."""
        if self.storage is None:
            return []
        return [self._running_state(r) for r in self._pf.values()]

    def _running_state(self, run: _Running) -> PrefetchState:
        return PrefetchState(run.req_id, "ongoing", run.asked,
                             self.prefetcher.completed_tokens(run.req_id), 0, "",
                             run.started_ns, run.anchor, run.start_len)

    def prefetch_host_slots(self) -> dict[str, int]:
        """Host slots held by running (and draining) prefetches, per component."""
        if self.storage is None:
            return {}
        return {c.name: self.request_held[c.index][HOST] for c in self.comps}

    # ---- abort -------------------------------------------------------------------------------
    def abort_prefetch(self, req_id: str) -> bool:
        """Release everything of ``req_id``'s prefetch (the request left) and forget a
        finished one. Returns whether one was running. Mutates: frees its host slots (once the
        worker is done with them), releases the anchor's pin. Emits: a ``prefetch`` op record
        with reason ``aborted`` (when one was running)."""
        if not isinstance(req_id, str) or not req_id:
            raise TypeError(f"req_id must be a non-empty str, got {req_id!r}")
        if self.storage is None:
            return False
        self._pf_done.pop(req_id, None)
        if req_id not in self._pf:
            return False
        return self._ledger.run(ev.OP_PREFETCH, req_id, self._abort_prefetch, req_id)

    def _abort_prefetch(self, req_id: str) -> bool:
        run = self._pf.pop(req_id)
        self.prefetcher.abort(req_id)
        if run.receipt is not None:
            self.release(self.locks[run.receipt])
        self._pf_attrs = {ev.A_PREFETCH_REASON: pe.R_ABORTED, ev.A_PREFETCH_ASKED: run.asked,
                          ev.A_PREFETCH_HIT: 0, ev.A_NODE: run.anchor,
                          ev.A_PREFETCH_SECONDS: (time.time_ns() - run.started_ns) / 1e9}
        return True

    # ---- hand-back (inside poll) ---------------------------------------------------------------
    def _poll_prefetch(self) -> None:
        tok, t0 = self._begin(), time.time_ns()
        try:
            results = self.prefetcher.poll()
        except BaseException as e:
            err = self._poll_failed(tok, t0, e)
            if err is e:
                raise
            raise err from e
        if not results:
            self._end_op(tok, ev.OP_PREFETCH, None, {ev.A_PREFETCH_REASON: "drained"}, t0)
            return
        for i, res in enumerate(results):
            if i:
                tok, t0 = self._begin(), time.time_ns()
            attrs = self._hand_back(res)
            self._end_op(tok, ev.OP_PREFETCH, res.req_id, attrs, t0, force=True)

    def _poll_failed(self, tok, t0: int, e: BaseException) -> BaseException:
        """The controller's poll raised: close the ``prefetch`` op with the error (its record
        and the crash hook, like any op that raises) and return what to raise. A stop the
        controller's commit refused (``InvariantViolation`` with ``req_ids``) is renamed onto
        the prefetches' anchor nodes, with ``rule`` and ``nodes``."""
        self._depth -= 1
        err = e
        req_ids = [r for r in getattr(e, "req_ids", ()) if r in self._pf]
        if isinstance(e, InvariantViolation) and req_ids:
            err = InvariantViolation([(name, self._pf[r].anchor, f"{detail}")
                                      for (name, _seq, detail), r in zip(e.violations, req_ids,
                                                                         strict=False)])
            err.rule, err.nodes = err.violations[0][0], tuple(self._pf[r].anchor for r in req_ids)
        if tok is not None:
            op_id, _start, seq_first = tok
            self._emit_record((op_id, ev.OP_PREFETCH, t0, time.time_ns(),
                               req_ids[0] if req_ids else None, None, seq_first, self.seq,
                               {ev.A_NODE: self._pf[req_ids[0]].anchor} if req_ids else {},
                               f"{type(err).__name__}: {err}"))
        self._after_error(ev.OP_PREFETCH, err)
        return err

    def _hand_back(self, res: PrefetchResult) -> dict:
        run = self._pf.pop(res.req_id)
        anchor = self.tree.nodes[run.anchor]
        deepest = self._adopt(anchor, run, res) if res.tokens else anchor
        if run.receipt is not None:
            self.release(self.locks[run.receipt])
        hit = self.tree.prefix_len(deepest) - run.start_len  # what the tree holds past the anchor
        self._pf_done[res.req_id] = PrefetchState(
            res.req_id, "done", run.asked, res.tokens, hit, res.reason, run.started_ns,
            run.anchor, run.start_len, res.seconds)
        while len(self._pf_done) > DONE_KEPT:
            self._pf_done.popitem(last=False)
        if res.tokens and deepest.data[0].values[STORAGE] is None \
                and self.storage.write_policy != "write_back":
            self._store_wanted[deepest.id] = None  # the anchor's chain was not stored: write it
        return {ev.A_PREFETCH_REASON: res.reason, ev.A_PREFETCH_ASKED: res.asked_tokens,
                ev.A_PREFETCH_HIT: hit, ev.A_PREFETCH_FOUND: res.hit_tokens,
                ev.A_PREFETCH_SECONDS: res.seconds, ev.A_NODE: deepest.id}

    def _adopt(self, anchor: Node, run: _Running, res: PrefetchResult) -> Node:
        """Turn a result's slots into host-only nodes under ``anchor``; free what the tree
        already holds (and, under write-through, what cannot hang under a node that found no
        host room for its backup). Returns the deepest node of the hit in the tree."""
        ps, total = self.page_size, res.tokens
        toks = run.tokens[:total]
        full = res.full_slots
        aux = dict(res.aux_slots)
        drop: list[tuple[int, torch.Tensor]] = []
        node, off = anchor, 0
        while off < total:  # the part another request put in the tree meanwhile
            step = self.tree.descend(node, toks, off, run.extra_key)
            if step is None:
                break
            child, k = step
            if k < len(child.key):
                child = self.split(child, k)
            drop.append((0, full[off:off + k]))
            node, off = child, off + k
        if (off < total and node.parent is not None and node.data[0].values[HOST] is None
                and self.config.write_policy != "write_back" and self._backup(node) is None):
            # host copies are prefix-closed under write-through: the new host-only nodes need
            # their parent on host; with no host room for its backup they cannot hang there
            drop.append((0, full[off:total]))
            total = off
        new_tokens = total - off
        si, mi = self.ci.get(WINDOW), self.ci.get(STATE)
        swa = aux.get(WINDOW)
        w = 0 if swa is None else min(swa.numel(), new_tokens)
        if swa is not None and swa.numel() > w:
            drop.append((si, swa[:swa.numel() - w]))
        stored = node.parent is None or node.data[0].values[STORAGE] is not None
        hashes = res.page_hashes
        for a, b in ((off, total - w), (total - w, total)):
            if b <= a:
                continue
            leaf = self.new_leaf(node, toks[a:b], run.extra_key)
            self._adopt_value(leaf, 0, full[a:b])
            if stored:
                self.set_value(leaf, 0, STORAGE, StoredPages(hashes[a // ps:b // ps], ps))
            if b == total and w:
                self._adopt_value(leaf, si, swa[swa.numel() - w:])
                if stored:
                    self.set_value(leaf, si, STORAGE, StoredPages(hashes[a // ps:b // ps], ps))
            node = leaf
        state = aux.get(STATE)
        if state is not None and state.numel():
            d = node.data[mi]
            if (node.parent is not None and d.values[DEVICE] is None and d.values[HOST] is None
                    and node.data[0].values[HOST] is not None):
                self._adopt_value(node, mi, state)
                if node.data[0].values[STORAGE] is not None:
                    self.set_value(node, mi, STORAGE, StoredPages(hashes[-1:], ps, True))
            else:
                drop.append((mi, state))
        for ci, slots in drop:
            if slots.numel():
                self.free_slots(ci, HOST, slots)
                self.request_held[ci][HOST] -= slots.numel()
        if node.parent is not None:
            self.touch(node)
        return node

    def _adopt_value(self, node: Node, ci: int, slots: torch.Tensor) -> None:
        self.set_value(node, ci, HOST, slots.clone())
        self.request_held[ci][HOST] -= slots.numel()


__all__ = ["DONE_KEPT", "PREFETCH_OWNER", "StoragePrefetch"]
