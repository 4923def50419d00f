"""Builds one OpenTelemetry span per cache operation, off the cache's hot path.

Spans are made with the real times the cache measured (``start_time`` / ``end(end_time)``),
parented on the caller's span captured at call time (its ids arrive in the ``CompactOp``), and,
for asynchronous transfers, *linked* to the span of the op that enqueued them (its context is
remembered here by op id). Attribute names come from ``telemetry.names``.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from cache import events as ev
from telemetry import names as n
from telemetry.encode import CompactOp

_SCALARS = (bool, int, float, str)
_EMPTY = Context()
_VERSION = "0.1.0"


def span_attributes(op: CompactOp) -> dict[str, Any]:
    """The attributes of an op's span: the fixed ones plus the op record's ``attrs`` mapped
    through ``names.OP_ATTRIBUTES`` (unknown keys go under ``kv_cache.attr.<key>``).

    Args:
        op: the compact op record.

    Returns:
        A dict of OTel-valid attribute values (None values are left out).
    """
    out: dict[str, Any] = {
        n.ATTR_OP_ID: op.op_id,
        n.ATTR_SEQ: op.seq_last,
        n.ATTR_OP_MUTATIONS: max(0, op.seq_last - op.seq_first + 1),
    }
    if op.req_id is not None:
        out[n.ATTR_REQUEST_ID] = str(op.req_id)
    for key, value in op.attrs.items():
        if value is None:
            continue
        name = n.OP_ATTRIBUTES.get(key) or f"{n.ATTR_OTHER_PREFIX}.{_snake(key)}"
        per_comp = _as_mapping(value)
        if per_comp is not None:
            for comp, v in per_comp.items():
                out[f"{name}.{_snake(str(comp))}"] = _attr_value(v)
        else:
            out[name] = _attr_value(value)
    if op.error:
        out[n.ATTR_ERROR_TYPE] = error_type(op.error)
    return out


def error_type(error: str) -> str:
    """``error.type`` for an op's error text: the exception class name when it leads the text
    (``"CacheOutOfMemory: ..."``), else ``_OTHER`` (the semantic-convention fallback)."""
    head = error.split(":", 1)[0].strip()
    return head if head.isidentifier() else "_OTHER"


def _as_mapping(value: Any) -> Mapping | None:
    if isinstance(value, Mapping):
        return value
    if (isinstance(value, (tuple, list)) and value
            and all(isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str)
                    and isinstance(p[1], (int, float)) for p in value)):
        return dict(value)
    return None


def _attr_value(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (tuple, list)):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return list(value)
        if all(isinstance(v, str) for v in value):
            return list(value)
    return repr(value)


def _snake(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key.lower())


class SpanBuilder:
    """Makes the spans of compact op records on a tracer provider.

    Args:
        tracer_provider: any OTel ``TracerProvider`` (an API no-op provider makes no spans).
        link_memory: how many recent ops' span contexts are kept for transfer links.
    """

    def __init__(self, tracer_provider: trace.TracerProvider, link_memory: int = 65536) -> None:
        self.tracer = tracer_provider.get_tracer(n.INSTRUMENTATION_SCOPE, _VERSION)
        self._contexts: collections.OrderedDict[int, SpanContext] = collections.OrderedDict()
        self._link_memory = link_memory

    def build(self, op: CompactOp) -> tuple[str | None, str | None, str | None]:
        """Make, end and hand to the provider's processors the span of one op.

        Args:
            op: the compact op record.

        Returns:
            ``(trace_id, span_id, parent_span_id)`` in hex, or Nones when nothing was recorded.
        """
        ctx = _EMPTY
        if op.parent_span_id:
            parent = SpanContext(op.parent_trace_id, op.parent_span_id,
                                 is_remote=op.parent_remote,
                                 trace_flags=TraceFlags(op.parent_flags))
            ctx = trace.set_span_in_context(NonRecordingSpan(parent), _EMPTY)
        links: tuple[Link, ...] = ()
        if op.op == ev.OP_TRANSFER:
            enq = op.attrs.get(ev.A_ENQUEUED_BY)
            linked = self._contexts.get(enq) if enq is not None else None
            if linked is not None:
                links = (Link(linked, {n.LINK_ATTR_OP_ID: enq}),)
        span = self.tracer.start_span(n.span_name(op.op), context=ctx, kind=SpanKind.INTERNAL,
                                      attributes=span_attributes(op), links=links,
                                      start_time=op.start_ns)
        recording = span.is_recording()
        if recording and op.error:
            span.set_status(Status(StatusCode.ERROR, op.error))
        span.end(end_time=max(op.end_ns, op.start_ns))
        if not recording:
            return (None, None, None)
        sc = span.get_span_context()
        self._remember(op.op_id, sc)
        return (format(sc.trace_id, "032x"), format(sc.span_id, "016x"),
                format(op.parent_span_id, "016x") if op.parent_span_id else None)

    def _remember(self, op_id: int, sc: SpanContext) -> None:
        self._contexts[op_id] = sc
        if len(self._contexts) > self._link_memory:
            self._contexts.popitem(last=False)
