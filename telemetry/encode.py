"""Compact, picklable forms of what crosses from the cache's process to the sinks.

Op records carry the caller's OTel ``Context``, which cannot leave the process; the drain
thread replaces it with the parent span's ids here. Finished OTel spans (the host process's own,
e.g. an engine's request spans) become plain row tuples. Messages are plain tuples:

- ``("attach", info, snapshot_dict)``
- ``("ops", [compact op, ...], [mutation tuple, ...])``
- ``("spans", [span row, ...])``
- ``("event", ts_ns, seq, kind, attrs)``
- ``("violation", ts_ns, seq, kind, message, details)``
- ``("host_stats", health snapshot dict)``
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from opentelemetry import trace

from cache.events import OpRecord


class CompactOp(NamedTuple):
    """An op record with its context reduced to the parent span's ids (0 = no parent)."""

    op_id: int
    op: str
    start_ns: int
    end_ns: int
    req_id: str | None
    parent_trace_id: int
    parent_span_id: int
    parent_flags: int
    parent_remote: bool
    seq_first: int
    seq_last: int
    attrs: dict
    error: str | None


class SpanRow(NamedTuple):
    """One finished span as stored: ids as lowercase hex, JSON text for the structured parts."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status_code: str
    status_message: str | None
    attributes: str
    events: str
    links: str
    resource: str
    scope: str | None
    op_id: int | None


_NO_PARENT = (0, 0, 0, False)


def compact_ops(batch: Iterable[tuple[OpRecord, list]]) -> tuple[list[CompactOp], list[tuple]]:
    """Reduce a drained batch to compact ops and one flat list of mutations.

    Consecutive ops usually share one ``Context`` object (the caller's current context does not
    change between calls), so the parent lookup is done once per distinct context.

    Args:
        batch: ``(OpRecord, mutations)`` pairs as recorded.

    Returns:
        ``(ops, mutations)`` in recording order.
    """
    ops: list[CompactOp] = []
    muts: list[tuple] = []
    last_ctx: Any = None
    parent = _NO_PARENT
    for op, ms in batch:
        ctx = op.context
        if ctx is not last_ctx:
            last_ctx = ctx
            parent = _parent_of(ctx)
        ops.append(CompactOp(op.op_id, op.op, op.start_ns, op.end_ns, op.req_id, parent[0],
                             parent[1], parent[2], parent[3], op.seq_first, op.seq_last,
                             op.attrs if op.attrs is not None else {}, op.error))
        if ms:
            muts.extend(ms)
    return ops, muts


def _parent_of(ctx: Any) -> tuple[int, int, int, bool]:
    if ctx is None:
        return _NO_PARENT
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return _NO_PARENT
    return (sc.trace_id, sc.span_id, int(sc.trace_flags), bool(sc.is_remote))


def span_row(span: Any, op_id: int | None = None) -> SpanRow:
    """Convert a finished SDK ``ReadableSpan`` into a store row.

    Args:
        span: an ended ``opentelemetry.sdk.trace.ReadableSpan``.
        op_id: the cache op the span represents (None for non-cache spans); when None it is
            read from the span's ``kv_cache.op.id`` attribute if present.

    Returns:
        The row.
    """
    from telemetry.names import ATTR_OP_ID

    ctx = span.get_span_context()
    parent = span.parent
    attrs = dict(span.attributes or {})
    if op_id is None:
        v = attrs.get(ATTR_OP_ID)
        op_id = int(v) if isinstance(v, int) else None
    scope = span.instrumentation_scope
    return SpanRow(
        trace_id=format(ctx.trace_id, "032x"),
        span_id=format(ctx.span_id, "016x"),
        parent_span_id=format(parent.span_id, "016x") if parent is not None else None,
        name=span.name,
        kind=span.kind.name if span.kind is not None else "INTERNAL",
        start_ns=int(span.start_time or 0),
        end_ns=int(span.end_time or span.start_time or 0),
        status_code=span.status.status_code.name,
        status_message=span.status.description,
        attributes=dumps(attrs),
        events=dumps([[e.name, e.timestamp, dict(e.attributes or {})] for e in span.events]),
        links=dumps([[format(lk.context.trace_id, "032x"), format(lk.context.span_id, "016x"),
                      dict(lk.attributes or {})] for lk in span.links]),
        resource=dumps(dict(span.resource.attributes) if span.resource is not None else {}),
        scope=scope.name if scope is not None else None,
        op_id=op_id,
    )


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=repr, ensure_ascii=False)


def dumps(value: Any) -> str:
    """Compact JSON; tuples become lists, anything JSON cannot express becomes its ``repr``."""
    return _ENCODER.encode(value)


def hex_ids(trace_id: int, span_id: int) -> tuple[str | None, str | None]:
    """OTel hex forms of a trace and span id (None for the invalid id 0)."""
    return (format(trace_id, "032x") if trace_id else None,
            format(span_id, "016x") if span_id else None)
