"""Records with an L3 tier in them, in the format STORAGE_SPEC fixes for the cache, made from a
real cache's records: a recorder that sits between the cache and telemetry and, after every op
that left a node's component with a host value not yet in L3, appends the ``store`` transfer the
write-through path makes (``transfer.start`` to tier ``storage``, ``comp.state`` with the
STORAGE length, ``transfer.done``), and keeps the STORAGE length on every later ``comp.state``
of that node (the host length while it has one). Seqs are renumbered so the stream stays
contiguous. ``start`` / ``mutations`` keep what was sent, for a reference replay
(``cache.snapshot.replay``) independent of the store."""

from __future__ import annotations

import time
from typing import Any

from radixscope.cache import events as ev
from radixscope.cache.events import Recorder
from radixscope.cache.tiers import HOST, STORAGE


class StorageTap(Recorder):
    """Forward a cache's records to ``inner`` with L3 writes added (module docstring)."""

    def __init__(self, inner: Recorder) -> None:
        self.inner = inner
        self.enabled = True
        self.capture_context = getattr(inner, "capture_context", False)
        self.stored: dict[tuple[int, str], int] = {}  # (node, comp) -> STORAGE length
        self.start: Any = None
        self.mutations: list[tuple] = []
        self.stores = 0  # store transfers added
        self._off = 0
        self._op = 10_000_000
        self._tid = 10_000_000
        self._states: dict[tuple[int, str], tuple] = {}

    def attach(self, info: dict, snapshot: Any) -> None:
        self.start = snapshot
        for nd in snapshot.nodes:
            for c, st in zip(snapshot.components, nd.components, strict=True):
                self._states[(nd.node_id, c)] = (st.lens, st.refs)
        self.inner.attach(info, snapshot)

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        out: list[tuple] = []
        fresh: dict[tuple[int, str], int] = {}
        for m in mutations:
            seq, op_id, kind, node, comp, tier, value = m
            if kind == ev.NODE_DELETE:  # its values go with it: nothing of it to store
                for k in [k for k in self.stored if k[0] == node]:
                    del self.stored[k]
                for k in [k for k in fresh if k[0] == node]:
                    del fresh[k]
            if kind == ev.COMP_STATE:
                lens, refs = value
                key = (node, comp)
                host = lens[HOST]
                if key in self.stored:
                    if host is not None:
                        self.stored[key] = host
                    lens = tuple(self.stored[key] if t == STORAGE else n
                                 for t, n in enumerate(lens))
                elif host is not None:
                    fresh[key] = host
                else:
                    fresh.pop(key, None)
                value = (lens, refs)
                self._states[key] = value
            out.append((seq + self._off, op_id, kind, node, comp, tier, value))
        first = op[6] + self._off
        last = first + len(out) - 1
        self.mutations += out
        self.inner.record(op[:6] + (first, last) + op[8:], out)
        if fresh:
            self._store(fresh, last)

    def _store(self, fresh: dict[tuple[int, str], int], last: int) -> None:
        """One ``store`` transfer op writing ``fresh`` to L3 (what the core's writer acks)."""
        self._op += 1
        self._tid += 1
        anchor = next(iter(fresh))[0]
        nodes = tuple(dict.fromkeys(k[0] for k in fresh))
        amounts = tuple((c, n) for (_, c), n in fresh.items())
        muts: list[tuple] = [(0, self._op, ev.TRANSFER_START, anchor, None, ev.TIER_STORAGE,
                              (self._tid, "store", nodes, amounts))]
        for (node, comp), n in fresh.items():
            self.stored[(node, comp)] = n
            muts.append((0, self._op, ev.COMP_STATE, node, comp, None, None))
        muts.append((0, self._op, ev.TRANSFER_DONE, anchor, None, ev.TIER_STORAGE,
                     (self._tid, True)))
        seqd = []
        for i, m in enumerate(muts):
            seqd.append((last + 1 + i, *m[1:]))
        # the comp.state values: the node's last known state with the STORAGE length set
        for i, m in enumerate(seqd):
            if m[2] == ev.COMP_STATE:
                key = (m[3], m[4])
                lens, refs = self._states[key]
                lens = tuple(self.stored[key] if t == STORAGE else n for t, n in enumerate(lens))
                self._states[key] = (lens, refs)
                seqd[i] = (*m[:6], (lens, refs))
        now = time.time_ns()
        op = (self._op, ev.OP_TRANSFER, now, now, None, None, last + 1, last + len(seqd),
              {ev.A_TRANSFER: self._tid, ev.A_TRANSFER_KIND: "store", ev.A_NODE: anchor,
               ev.A_NODES: len(nodes)}, None)
        self._off += len(seqd)
        self.stores += 1
        self.mutations += seqd
        self.inner.record(op, seqd)

    def __getattr__(self, name: str) -> Any:  # flush hooks etc. of the inner recorder
        return getattr(self.inner, name)
