"""Compact, picklable forms of what crosses from the cache's process to the sinks.

Op records carry the caller's OTel ``Context``, which cannot leave the process; the drain
thread replaces it with the parent span's ids here. Finished OTel spans (the host process's own,
e.g. an engine's request spans) become plain row tuples. Messages are plain tuples:

- ``("attach", info, snapshot_dict)``
- ``("ops", op columns, mutation columns)`` (see ``compact_ops``)
- ``("spans", [span row, ...])``
- ``("event", ts_ns, seq, kind, attrs)``
- ``("violation", ts_ns, seq, kind, message, details)``
- ``("host_stats", health snapshot dict)``
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import propagation as _propagation

from cache.events import OpRecord


class CompactOp(NamedTuple):
    """An op record with its context reduced to the parent span's ids (0 = no parent).

    Built in the sink by ``decode_ops`` from the columns ``compact_ops`` ships.
    """

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


def compact_ops(batch: list[tuple[OpRecord, list]]) -> tuple:
    """Encode a drained batch as the ``("ops", op_columns, mutation_columns)`` message.

    Columns, not rows: ``zip(*...)`` transposes in C, so no per-op tuple is built here, and a
    pickled column costs less than the same values spread over many small tuples. The op
    columns are ``OpRecord``'s fields with ``context`` replaced by the parent span's ids
    ``(trace_id, span_id, flags, is_remote)`` (consecutive ops usually share one ``Context``
    object, so each distinct one is resolved once). ``decode_ops`` restores rows.

    Args:
        batch: ``(OpRecord, mutations)`` pairs as recorded (non-empty).

    Returns:
        The message tuple.
    """
    records, mut_lists = zip(*batch, strict=True)
    cols = list(zip(*records, strict=True))
    parents = []
    last_ctx: Any = _UNSET
    parent = _NO_PARENT
    by_span: dict[int, tuple[int, int, int, bool]] = {}
    for ctx in cols[_CTX]:
        if ctx is not last_ctx:  # a new context object, often around the same span
            last_ctx = ctx
            span = _span_in(ctx)
            parent = by_span.get(id(span)) if span is not None else _NO_PARENT
            if parent is None:
                parent = by_span[id(span)] = _ids_of(span)
        parents.append(parent)
    cols[_CTX] = parents
    muts = [m for ms in mut_lists if ms for m in ms]
    return ("ops", cols, list(zip(*muts, strict=True)) if muts else [])


def decode_ops(op_cols: list, mut_cols: list) -> tuple[list[CompactOp], list[tuple]]:
    """Rows back from ``compact_ops``' columns: compact ops and mutation tuples."""
    ops = [CompactOp(oid, name, start, end, req, par[0], par[1], par[2], par[3], sf, sl,
                     attrs if attrs is not None else {}, err)
           for oid, name, start, end, req, par, sf, sl, attrs, err in zip(*op_cols, strict=True)]
    return ops, list(zip(*mut_cols, strict=True))


_UNSET = object()
_CTX = OpRecord._fields.index("context")


def _span_in(ctx: Any) -> Any:
    """The current span stored in a ``Context`` (None if none): a dict lookup, avoiding
    ``trace.get_current_span``'s ABC isinstance check on this per-op path."""
    if ctx is None:
        return None
    if _SPAN_KEY is None:
        return trace.get_current_span(ctx)
    return ctx.get(_SPAN_KEY)


def _ids_of(span: Any) -> tuple[int, int, int, bool]:
    sc = span.get_span_context()
    if sc is None or not sc.is_valid:
        return _NO_PARENT
    return (sc.trace_id, sc.span_id, int(sc.trace_flags), bool(sc.is_remote))


_SPAN_KEY = getattr(_propagation, "_SPAN_KEY", None)  # the API's context key of the span


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
# ``JSONEncoder.encode`` builds a C encoder on every call (about as costly as encoding a small
# tuple); build it once. Same output as ``_ENCODER.encode``; the pure-Python path is the fallback.
_C_ENCODE = (json.encoder.c_make_encoder(None, repr, json.encoder.encode_basestring, None, ":",
                                         ",", False, False, True)
             if json.encoder.c_make_encoder is not None else None)


def dumps(value: Any) -> str:
    """Compact JSON; tuples become lists, anything JSON cannot express becomes its ``repr``."""
    if _C_ENCODE is None or isinstance(value, str):
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def hex_ids(trace_id: int, span_id: int) -> tuple[str | None, str | None]:
    """OTel hex forms of a trace and span id (None for the invalid id 0)."""
    return (format(trace_id, "032x") if trace_id else None,
            format(span_id, "016x") if span_id else None)
