"""The store sink: every op, mutation, span, event and violation into the SQLite store.

Built from the registry as ``store`` (``telemetry/sinks/base.py``) with plain-data options:
``StoreSink(health, path, keyframe_every=, keyframe_nodes=, sample_every_ms=, resource=)``.
Beside the rows it writes a keyframe every ``keyframe_every`` mutations (and at least
``keyframe_nodes`` times the node count: a keyframe's cost grows with the tree) and a pool
sample every ``sample_every_ms`` of cache time, both read off the fan-out's journal replica; it
commits once per batch of messages (``commit``). Samples are in cache time: the attach state's
is stamped at the first op's start (at ``flush`` if no op comes), each later one at the end of
the op whose state it holds; a batch spanning several intervals is cut there (``cuts``), so a
writer that fell behind still samples every interval. Each op row carries its span's ids, read
from the span sink's ``ids`` (``bind``); without a span sink, none. Host-process spans arrive
as rows (the ``spans`` message, process mode) or as SDK spans through ``put_span`` (inline
mode).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixscope.telemetry.names import INSTRUMENTATION_SCOPE
from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.record.encode import CompactOp, SpanRow, span_row
from radixscope.telemetry.sinks.spans import NO_IDS
from radixscope.telemetry.store import keyframes
from radixscope.telemetry.store.writer import StoreWriter

if TYPE_CHECKING:
    from radixscope.cache.snapshot import CacheSnapshot
    from radixscope.telemetry.store.journal import Journal


class StoreSink:
    """The embedded store's writer side (see the module docstring).

    Args:
        health: the fan-out's counters.
        path: an existing store file (``create_store`` made it).
        keyframe_every: mutations between keyframes, at least.
        keyframe_nodes: and at least this many times the replica's node count (0: off).
        sample_every_ms: cache time between pool samples (0: one per batch, never cut).
        resource: attributes of the resource the cache's spans carry (the ``resource`` info).

    Raises:
        ValueError: ``keyframe_every`` < 1 or ``keyframe_nodes`` < 0.
    """

    # closes after the exporting sinks, so their shutdown failures reach the stored stats
    records_close = True

    def __init__(self, health: Health, path: str, keyframe_every: int = 20000,
                 sample_every_ms: float = 100.0, resource: dict | None = None,
                 keyframe_nodes: float = 2.0) -> None:
        if keyframe_every < 1:
            raise ValueError(f"keyframe_every={keyframe_every!r}: must be >= 1")
        if not keyframe_nodes >= 0:
            raise ValueError(f"keyframe_nodes={keyframe_nodes!r}: must be >= 0")
        self.keyframe_nodes = keyframe_nodes
        self.health = health
        self.store = StoreWriter(path)
        self.keyframe_every = keyframe_every
        self.sample_every_ns = int(sample_every_ms * 1e6)
        self.journal: Journal | None = None
        self._resource = dict(resource or {})
        self._spans: Any = None  # the span sink, whose ``ids`` are the last batch's
        self._stats: Any = health.snapshot
        self._span_q: collections.deque = collections.deque()
        self._kf_at = 0
        self._sample_ns = 0
        self._last_end_ns = 0
        self._first: tuple[int, list] | None = None  # the attach state's sample, until an op
        self._first_at: int | None = None  # its stamp, when ``cuts`` saw the whole batch

    def bind(self, fanout: Any) -> None:
        """The span sink's ids and the fan-out's merged stats."""
        self._spans = fanout.named.get("spans")
        self._stats = fanout.stats

    def put_span(self, span: Any) -> None:
        """Queue a finished SDK span for the store (thread-safe; a span processor's hook).
        The cache's own spans are skipped: their op rows already carry them."""
        scope = span.instrumentation_scope
        if scope is None or scope.name != INSTRUMENTATION_SCOPE:
            self._span_q.append(span)

    # ---- the stream ------------------------------------------------------------------------
    def attach(self, info: dict, snapshot: CacheSnapshot, replica: Journal | None) -> None:
        self.journal = replica
        st = self.store
        st.set_info("cache", info)
        st.set_info("resource", self._resource)
        st.write_node_tokens((n.node_id, n.tokens) for n in snapshot.nodes)
        st.write_keyframe(snapshot.seq, snapshot.to_dict())
        if replica is not None:  # stamped by the first op: the writer's clock here lags
            self._first = (snapshot.seq, replica.pools())

    def cuts(self, ops: Sequence[CompactOp]) -> list[int]:
        """Indices of ``ops`` after which a pool sample is due, but the last: the fan-out ends
        a sub-batch after each (``Fanout._ops``), so each sample reads the replica at its own
        op, and ``ops`` takes the last at the batch's end as for any batch. Empty (the common
        batch, checked in O(1)) unless the batch spans two sample intervals."""
        every = self.sample_every_ns
        j = self.journal
        if not ops or every <= 0 or j is None or j.broken:
            return []
        last = self._last_end_ns
        if self._first is None:
            at = self._sample_ns
        else:  # the attach sample goes at the batch's earliest start, whichever sub-batch
            at = self._first_at = _first_start(ops)  # holds it (``ops`` stamps it so)
        if max(last, ops[-1].end_ns) - at < 2 * every:
            return []
        out = []
        for i, op in enumerate(ops):  # what ``ops`` would decide were a sub-batch to end here
            end = op.end_ns if op.end_ns > last else last
            if end - at >= every:
                out.append(i)
                at = last = end
        return out[:-1]

    def ops(self, ops: Sequence[CompactOp], mutations: Sequence[tuple]) -> None:
        if ops:
            if self._first is not None:
                start = _first_start(ops)
                self._write_first(self._first, start if self._first_at is None
                                  else min(start, self._first_at))
            self._last_end_ns = max(self._last_end_ns, ops[-1].end_ns)
        spans = self._spans
        ids = spans.ids if spans is not None else ()
        if len(ids) != len(ops):
            ids = [NO_IDS] * len(ops)
        st = self.store
        st.write_ops(ops, ids)
        st.write_journal(mutations)
        j = self.journal
        if j is None or j.broken:
            return
        since = j.applied - self._kf_at
        if since >= self.keyframe_every and since >= self.keyframe_nodes * len(j.builder.nodes):
            with self.health.guard("keyframe"):
                self._kf_at = j.applied
                st.write_keyframe(j.seq, keyframes.encode(j.keyframe_dict()))
        if self._last_end_ns - self._sample_ns >= self.sample_every_ns:
            self._sample_ns = self._last_end_ns
            st.write_metrics(j.seq, self._last_end_ns, j.pools())

    def event(self, ts_ns: int, seq: int | None, kind: str, attrs: dict) -> None:
        self.store.write_event(ts_ns, seq, kind, attrs)

    def spans(self, rows: Sequence[SpanRow]) -> None:
        """Host-process spans, already rows (process mode)."""
        self.store.write_spans(rows)

    def violation(self, *args: Any) -> None:
        self.store.write_violation(*args)

    def commit(self) -> None:
        """End of a batch of messages: queued host spans, then one commit."""
        self._drain_spans()
        with self.health.guard("store.commit"):
            self.store.commit()

    def _drain_spans(self) -> None:
        q = self._span_q
        if not q:
            return
        rows: list[SpanRow] = []
        while q:
            span = q.popleft()
            with self.health.guard("span_row"):
                rows.append(span_row(span))
        if rows:
            with self.health.guard("store.spans"):
                self.store.write_spans(rows)

    # ---- lifecycle -------------------------------------------------------------------------
    def end(self, clean: bool) -> None:
        """The ``closed`` info row, before the final flush (``clean``: the host closed
        telemetry; False when its process went away without closing: killed, crashed)."""
        with self.health.guard("store.closed_row"):
            j = self.journal
            self.store.set_info("closed", {
                "clean": bool(clean), "ts_ns": time.time_ns(),
                "last_seq": j.last_seq if j is not None else None,
                "reason": None if clean else "the host process ended without closing "
                                             "telemetry (killed or crashed)"})

    def flush(self) -> None:
        """Queued host spans, a final pool sample, the replica's gaps and the stats; commit."""
        self._drain_spans()
        with self.health.guard("store.flush"):
            j = self.journal
            if self._first is not None:  # no op came: the attach state, stamped now
                self._write_first(self._first, time.time_ns())
            elif j is not None and not j.broken:
                self.store.write_metrics(j.seq, max(self._last_end_ns, time.time_ns()),
                                         j.pools())
            if j is not None:
                self.store.set_info("gaps", j.gaps)
                self.store.set_info("last_seq", j.last_seq)
            self.store.set_info("stats", self._stats())
            self.store.commit()

    def close(self) -> None:
        with self.health.guard("store.close"):
            self.store.close()

    def _write_first(self, first: tuple[int, list], ts_ns: int) -> None:
        """The attach state's pool sample (``first``: seq, pools) at ``ts_ns``; later samples
        count from it."""
        seq, pools = first
        self._first = None
        self._sample_ns = ts_ns
        self.store.write_metrics(seq, ts_ns, pools)


def _first_start(ops: Sequence[CompactOp]) -> int:
    """The earliest start in ``ops`` (a transfer's record starts when it was enqueued)."""
    return min(op.start_ns for op in ops)
