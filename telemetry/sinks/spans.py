"""One OpenTelemetry span per cache operation, made off the cache's hot path.

Every span has the real times the cache measured, is parented on the caller's span captured at
call time (its ids arrive in the ``CompactOp``) and, for an asynchronous transfer, is *linked* to
the span of the op that enqueued it. Names come from ``telemetry.names``. Two builders:

- ``TracerSpans`` (inline mode) goes through a tracer provider's ``start_span`` /
  ``end(end_time)``, so the provider's sampler and processors (an ``InMemorySpanExporter``...)
  see the spans exactly as they see any other.
- ``DirectSpans`` (the writer process) assigns the span ids itself (random, like the SDK's
  ``RandomIdGenerator``; an op under an unsampled parent is not sampled) and materialises SDK
  ``ReadableSpan`` objects only when an exporter (OTLP, console) is configured. The store needs
  no span objects: an op's row carries its span's ids and the reader renders it as a span.
"""

from __future__ import annotations

import collections
import random

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from radixscope.cache import events as ev
from radixscope.telemetry import names as n
from radixscope.telemetry.record.encode import CompactOp
from radixscope.telemetry.store.span_attrs import error_type, span_attributes

_EMPTY = Context()
VERSION = "0.1.0"
SCOPE = InstrumentationScope(n.INSTRUMENTATION_SCOPE, VERSION)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
__all__ = ["NO_IDS", "DirectSpans", "Ids", "TracerSpans", "error_type", "span_attributes"]
Ids = tuple[str | None, str | None, str | None]  # (trace_id, span_id, parent_span_id) in hex
NO_IDS: Ids = (None, None, None)


def _hex(trace_id: int, span_id: int, parent_span_id: int) -> Ids:
    return (format(trace_id, "032x"), format(span_id, "016x"),
            format(parent_span_id, "016x") if parent_span_id else None)


class _LinkMemory:
    """Span contexts of recent ops by op id (transfer spans link to their enqueuing op)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ctx: collections.OrderedDict[int, SpanContext] = collections.OrderedDict()

    def put(self, op_id: int, sc: SpanContext) -> None:
        self._ctx[op_id] = sc
        if len(self._ctx) > self._size:
            self._ctx.popitem(last=False)

    def links_for(self, op: CompactOp) -> tuple[Link, ...]:
        if op.op != ev.OP_TRANSFER:
            return ()
        enq = op.attrs.get(ev.A_ENQUEUED_BY)
        sc = self._ctx.get(enq) if enq is not None else None
        return (Link(sc, {n.LINK_ATTR_OP_ID: enq}),) if sc is not None else ()


class TracerSpans:
    """Spans through a tracer provider (inline mode).

    Args:
        tracer_provider: any OTel ``TracerProvider`` (an API no-op provider makes no spans).
        link_memory: how many recent ops' span contexts are kept for transfer links.
    """

    def __init__(self, tracer_provider: trace.TracerProvider, link_memory: int = 65536) -> None:
        self.tracer = tracer_provider.get_tracer(n.INSTRUMENTATION_SCOPE, VERSION)
        self._links = _LinkMemory(link_memory)

    def build(self, op: CompactOp) -> Ids:
        """Start and end the span of one op; its provider's processors receive it.

        Returns:
            ``(trace_id, span_id, parent_span_id)`` in hex, or Nones when not recorded.
        """
        ctx = _EMPTY
        if op.parent_span_id:
            parent = SpanContext(op.parent_trace_id, op.parent_span_id,
                                 is_remote=op.parent_remote,
                                 trace_flags=TraceFlags(op.parent_flags))
            ctx = trace.set_span_in_context(NonRecordingSpan(parent), _EMPTY)
        span = self.tracer.start_span(n.span_name(op.op), context=ctx, kind=SpanKind.INTERNAL,
                                      attributes=span_attributes(op),
                                      links=self._links.links_for(op), start_time=op.start_ns)
        recording = span.is_recording()
        if recording and op.error:
            span.set_status(Status(StatusCode.ERROR, op.error))
        span.end(end_time=max(op.end_ns, op.start_ns))
        if not recording:
            return NO_IDS
        sc = span.get_span_context()
        self._links.put(op.op_id, sc)
        return _hex(sc.trace_id, sc.span_id, op.parent_span_id)


class DirectSpans:
    """Span ids assigned here; ``ReadableSpan`` objects only for exporters (writer process).

    Args:
        resource: the resource exported spans carry.
        export: whether to materialise ``ReadableSpan`` objects into ``self.pending``.
        link_memory: how many recent ops' span contexts are kept for transfer links.
        seed: seed of the id generator (None: from the OS).
    """

    def __init__(self, resource: Resource, export: bool, link_memory: int = 65536,
                 seed: int | None = None) -> None:
        self.resource = resource
        self.export = export
        self.pending: list[ReadableSpan] = []
        self._links = _LinkMemory(link_memory)
        self._rand = random.Random(seed)
        self._pool = ""  # random hex digits, drawn in bulk: ids are slices of it
        self._pos = 0
        self._parents: dict[int, str] = {}  # parent span id -> hex (ops share few parents)

    def _hex_id(self, digits: int) -> str:
        """A random non-zero id of ``digits`` hex digits (16: span id, 32: trace id)."""
        while True:
            if self._pos + digits > len(self._pool):
                self._pool, self._pos = format(self._rand.getrandbits(4 * 8192), "08192x"), 0
            h = self._pool[self._pos:self._pos + digits]
            self._pos += digits
            if h.strip("0"):
                return h

    def build(self, op: CompactOp) -> Ids:
        """Assign the span ids of one op (and queue its ``ReadableSpan`` when exporting).

        Returns:
            ``(trace_id, span_id, parent_span_id)`` in hex, or Nones when the parent is not
            sampled.
        """
        parent_hex = None
        if op.parent_span_id:
            if not op.parent_flags & TraceFlags.SAMPLED:
                return NO_IDS
            trace_hex = format(op.parent_trace_id, "032x")
            parent_hex = self._parents.get(op.parent_span_id)
            if parent_hex is None:
                if len(self._parents) > 4096:
                    self._parents.clear()
                parent_hex = self._parents[op.parent_span_id] = format(op.parent_span_id,
                                                                       "016x")
        else:
            trace_hex = self._hex_id(32)
        span_hex = self._hex_id(16)
        if self.export:
            self._export(op, int(trace_hex, 16), int(span_hex, 16))
        return (trace_hex, span_hex, parent_hex)

    def _export(self, op: CompactOp, trace_id: int, span_id: int) -> None:
        sc = SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)
        parent = (SpanContext(trace_id, op.parent_span_id, is_remote=op.parent_remote,
                              trace_flags=TraceFlags(op.parent_flags))
                  if op.parent_span_id else None)
        status = Status(StatusCode.ERROR, op.error) if op.error else Status(StatusCode.UNSET)
        self.pending.append(ReadableSpan(
            n.span_name(op.op), context=sc, parent=parent, resource=self.resource,
            attributes=span_attributes(op), links=self._links.links_for(op),
            kind=SpanKind.INTERNAL, status=status, start_time=op.start_ns,
            end_time=max(op.end_ns, op.start_ns), instrumentation_scope=SCOPE))
        self._links.put(op.op_id, sc)

    def take(self) -> list[ReadableSpan]:
        out, self.pending = self.pending, []
        return out
