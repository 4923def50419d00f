"""The sinks, composed: spans, metrics, the store and any registered ``Sink``, fed from one stream.

``Fanout.handle`` takes a batch of messages (see ``telemetry/record/encode.py``), gives each op its span,
updates the metrics, replays the mutations into its ``Journal``, writes everything to the store
and commits once, adding a keyframe every ``keyframe_every`` mutations and a pool sample every
``sample_every_ms`` of cache time. The same class runs in the writer process (process mode) or
on the drain thread (inline mode). Each step is guarded: a failure is logged and counted.
Outputs beyond the built-in four are ``Sink`` objects (``telemetry/sinks/base.py``) in ``extra``:
each gets the attach, every op batch with its accepted mutations, every event, flush and close.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry import metrics

from radixscope.cache import events as ev
from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry.names import EVENT_ADMISSION, INSTRUMENTATION_SCOPE
from radixscope.telemetry.record.drops import Health, merge_stats
from radixscope.telemetry.record.encode import CompactOp, SpanRow, decode_records, span_row
from radixscope.telemetry.sinks.base import Sink
from radixscope.telemetry.sinks.journal import Journal
from radixscope.telemetry.sinks.metrics import CacheMetrics
from radixscope.telemetry.sinks.spans import NO_IDS, DirectSpans, Ids, TracerSpans
from radixscope.telemetry.store import keyframes
from radixscope.telemetry.store.writer import StoreWriter


class Fanout:
    """Consumes telemetry messages and fans them out to every output.

    Args:
        health: this side's counters.
        store: the store writer, or None (no store).
        spans: the span builder (``TracerSpans`` / ``DirectSpans``), or None (no spans).
        meter_provider: provider of the instruments, or None (no metrics).
        span_processors: with ``DirectSpans``, processors that receive the exported spans.
        keyframe_every: mutations between keyframes.
        sample_every_ms: cache time between pool samples in the store.
        flush_hook: called by ``flush`` (e.g. force-flushing providers).
        resource: attributes of the resource the cache's spans carry (stored in ``info``).
        extra: registered sinks (``sinkbase.build``) fed beside the built-in outputs.
    """

    def __init__(self, health: Health, store: StoreWriter | None,
                 spans: TracerSpans | DirectSpans | None,
                 meter_provider: metrics.MeterProvider | None,
                 span_processors: Sequence[Any] = (), keyframe_every: int = 20000,
                 sample_every_ms: float = 100.0,
                 flush_hook: Callable[[], None] | None = None,
                 resource: dict | None = None, extra: Sequence[Sink] = ()) -> None:
        if keyframe_every < 1:
            raise ValueError(f"keyframe_every={keyframe_every!r}: must be >= 1")
        self.health = health
        self.store = store
        self.spans = spans
        self.metrics = (CacheMetrics(meter_provider, self.stats)
                        if meter_provider is not None else None)
        self.span_processors = list(span_processors)
        self.journal: Journal | None = None
        self.keyframe_every = keyframe_every
        self.sample_every_ns = int(sample_every_ms * 1e6)
        self.host_stats: dict = {}
        self.ops_seen = 0
        self.closed = False
        self._flush_hook = flush_hook
        self._span_q: collections.deque = collections.deque()
        self._kf_at = 0
        self._sample_ns = 0
        self._last_end_ns = 0
        self._final: dict = {}
        self._resource = dict(resource or {})
        self.extra = list(extra)

    def put_span(self, span: Any) -> None:
        """Queue a finished SDK span for the store (thread-safe; a span processor's hook).
        The cache's own spans are skipped: their op rows already carry them."""
        scope = span.instrumentation_scope
        if scope is None or scope.name != INSTRUMENTATION_SCOPE:
            self._span_q.append(span)

    def stats(self) -> dict:
        """Host-side and sink-side health merged."""
        return merge_stats(self.host_stats, self.health.snapshot())

    # ---- message handling ------------------------------------------------------------------
    def handle(self, messages: Iterable[tuple]) -> None:
        """Process a batch of messages and commit the store once."""
        if self.closed:
            return
        for msg in messages:
            kind = msg[0]
            with self.health.guard(f"sink.{kind}"):
                if kind == "ops":
                    self._ops(*decode_records(msg[1]))
                elif kind == "spans":
                    if self.store is not None:
                        self.store.write_spans(msg[1])
                elif kind == "attach":
                    self._attach(msg[1], msg[2])
                elif kind == "event":
                    self._event(*msg[1:])
                elif kind == "violation":
                    if self.store is not None:
                        self.store.write_violation(*msg[1:])
                elif kind == "host_stats":
                    self.host_stats = msg[1]
                else:
                    raise ValueError(f"unknown telemetry message kind {kind!r}")
        self._export_spans()
        self._drain_spans()
        if self.store is not None:
            with self.health.guard("store.commit"):
                self.store.commit()

    def _attach(self, info: dict, snapshot: dict) -> None:
        if self.journal is not None:
            raise RuntimeError("a second cache attached to the same telemetry; ignored")
        snap = CacheSnapshot.from_dict(snapshot)
        self.journal = Journal(snap, self.health)
        if self.metrics is not None:
            self.metrics.journal = self.journal
        self._each("attach", info, snap, self.journal)
        if self.store is not None:
            self.store.set_info("cache", info)
            self.store.set_info("resource", self._resource)
            self.store.write_node_tokens((n.node_id, n.tokens) for n in snap.nodes)
            self.store.write_keyframe(snap.seq, snapshot)
            self.store.write_metrics(snap.seq, time.time_ns(), self.journal.pools())

    def _ops(self, ops: list[CompactOp], muts: list[tuple]) -> None:
        j = self.journal
        accepted = j.accept(muts) if j is not None else sorted(muts, key=lambda m: m[0])
        self.ops_seen += len(ops)
        if ops:
            self._last_end_ns = max(self._last_end_ns, ops[-1].end_ns)
        ids = [self._span(op) for op in ops] if self.spans is not None else [NO_IDS] * len(ops)
        if self.metrics is not None:
            with self.health.guard("metrics"):
                self.metrics.observe_ops(ops)
                self.metrics.observe_mutations(accepted)
        self._each("ops", ops, accepted)
        if self.store is None:
            return
        self.store.write_ops(ops, ids)
        self.store.write_mutations(accepted)
        self.store.write_node_tokens((m[3], m[6][2]) for m in accepted
                                     if m[2] == ev.NODE_CREATE)
        if j is None or j.broken:
            return
        if j.applied - self._kf_at >= self.keyframe_every:
            with self.health.guard("keyframe"):
                self._kf_at = j.applied
                self.store.write_keyframe(j.seq, keyframes.encode(j.keyframe_dict()))
        if self._last_end_ns - self._sample_ns >= self.sample_every_ns:
            self._sample_ns = self._last_end_ns
            self.store.write_metrics(j.seq, self._last_end_ns, j.pools())

    def _span(self, op: CompactOp) -> Ids:
        try:
            return self.spans.build(op)
        except Exception as e:  # noqa: BLE001 - guard point: log + count, keep the op row
            self.health.fail("span_build", e, f"op {op.op_id} ({op.op})")
            return NO_IDS

    def _export_spans(self) -> None:
        if not isinstance(self.spans, DirectSpans) or not self.spans.pending:
            return
        for span in self.spans.take():
            for proc in self.span_processors:
                with self.health.guard("span_export"):
                    proc.on_end(span)

    def _event(self, ts_ns: int, seq: int | None, kind: str, attrs: dict) -> None:
        if kind == EVENT_ADMISSION and self.metrics is not None:
            self.metrics.observe_admission(bool(attrs.get("admitted")))
        self._each("event", ts_ns, seq, kind, attrs)
        if self.store is not None:
            self.store.write_event(ts_ns, seq, kind, attrs)

    def _each(self, method: str, *args: Any) -> None:
        """Call ``method`` on every registered sink, each guarded on its own."""
        for sink in self.extra:
            with self.health.guard(f"sink.{type(sink).__name__}.{method}"):
                getattr(sink, method)(*args)

    def _drain_spans(self) -> None:
        q = self._span_q
        if not q:
            return
        rows: list[SpanRow] = []
        while q:
            span = q.popleft()
            with self.health.guard("span_row"):
                rows.append(span_row(span))
        if self.store is not None and rows:
            with self.health.guard("store.spans"):
                self.store.write_spans(rows)

    # ---- lifecycle -------------------------------------------------------------------------
    def flush(self) -> dict:
        """Flush providers, write a final pool sample and the stats, commit.

        Returns:
            This side's own health snapshot (the host merges it with its own).
        """
        if self.closed:
            return self._final
        if self._flush_hook is not None:
            with self.health.guard("flush_hook"):
                self._flush_hook()
        self._drain_spans()
        self._each("flush")
        if self.store is not None:
            with self.health.guard("store.flush"):
                j = self.journal
                if j is not None:
                    if not j.broken:
                        self.store.write_metrics(j.seq, max(self._last_end_ns, time.time_ns()),
                                                 j.pools())
                    self.store.set_info("gaps", j.gaps)
                    self.store.set_info("last_seq", j.last_seq)
                self.store.set_info("stats", self.stats())
                self.store.commit()
        return self.health.snapshot()

    def close(self, clean: bool = True) -> dict:
        """Final flush, the ``closed`` info row, then close the store. Idempotent.

        Args:
            clean: the host closed telemetry (``tel.close()``); False when the writer closes
                the store because its host process went away without closing (killed,
                crashed), so readers can tell the run did not finish.

        Returns:
            ``flush``'s snapshot.
        """
        if self.closed:
            return self._final
        if self.store is not None:
            with self.health.guard("store.closed_row"):
                j = self.journal
                self.store.set_info("closed", {
                    "clean": bool(clean), "ts_ns": time.time_ns(),
                    "last_seq": j.last_seq if j is not None else None,
                    "reason": None if clean else "the host process ended without closing "
                                                 "telemetry (killed or crashed)"})
        self._final = self.flush()
        self.closed = True
        self._each("close")
        if self.store is not None:
            with self.health.guard("store.close"):
                self.store.close()
        return self._final
