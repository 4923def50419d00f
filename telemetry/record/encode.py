"""Compact, picklable forms of what crosses from the cache's process to the sinks.

Op records carry the caller's OTel ``Context``, which cannot leave the process; the recorder
replaces it with the parent span's ids (``compact_record``) and encodes records a few dozen at
a time (``encode_batch``).
Finished OTel spans (the host process's own, e.g. an engine's request spans) become plain row
tuples. Messages are plain tuples:

- ``("attach", info, snapshot_dict)``
- ``("ops", [encoded batch of records, ...])``
- ``("spans", [span row, ...])``
- ``("event", ts_ns, seq, kind, attrs)``
- ``("violation", ts_ns, seq, kind, message, details)``
- ``("host_stats", health snapshot dict)``
"""

from __future__ import annotations

import io
import json
import marshal
import pickle
from array import array
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import propagation as _propagation

from radixscope.cache.events import NODE_CREATE as _NODE_CREATE
from radixscope.cache.events import OpRecord, attrs_dict


class CompactOp(NamedTuple):
    """An op record with its context reduced to the parent span's ids (0 = no parent).

    Built in the sink by ``decode_records``.
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


def compact_record(op: tuple, mutations: list, last: list) -> tuple:
    """An op record ready to encode: its ``context`` reduced to the parent span's ids.

    Args:
        op: the record, a tuple in ``OpRecord`` order.
        mutations: the op's mutation tuples.
        last: a one-slot cache ``[(context, parent ids)]``: consecutive ops usually run in the
            same (immutable) caller context, so its span's ids are looked up once.

    Returns:
        ``(op_id, op, start_ns, end_ns, req_id, (trace_id, span_id, flags, is_remote),
        seq_first, seq_last, attrs, error, mutations)``: plain data, no live objects (what
        the recorder buffers and ``encode_batch`` encodes).
    """
    ctx = op[5]
    cached = last[0]
    parent = cached[1] if cached[0] is ctx else _parent_ids(ctx, last)
    return (op[0], op[1], op[2], op[3], op[4], parent, op[6], op[7], op[8], op[9], mutations)


def _parent_ids(ctx: Any, last: list) -> tuple[int, int, int, bool]:
    """``(trace_id, span_id, flags, is_remote)`` of the span current in ``ctx`` (zeros when
    none); remembered in ``last`` (see ``compact_record``)."""
    span = _span_in(ctx) if ctx is not None else None
    parent = _ids_of(span) if span is not None else _NO_PARENT
    last[0] = (ctx, parent)
    return parent


def encode_batch(records: list[tuple]) -> tuple[bytes, list[tuple]]:
    """Compact records (``compact_record``) as one ``bytes``, in order.

    ``marshal`` (what ``.pyc`` files use) encodes these plain tuples a third to half faster
    than ``pickle``, and once per batch rather than per record. A batch holding something
    marshal cannot encode (an attribute value of another type) is pickled instead, record by
    record where needed: a record pickle cannot take either is kept with its odd values as
    text, and one that cannot even be walked is left out. ``decode`` tells marshal from pickle
    by the first byte. Both ends run the same interpreter (the writer is ``sys.executable``),
    so marshal's per-version format is never a problem: blobs are never persisted.

    Returns:
        ``(blob, lost)``: ``lost`` are the records that could not be encoded at all.
    """
    try:
        return _MARSHAL(records, _MARSHAL_VERSION), []
    except ValueError:  # something marshal cannot encode: pickle
        pass
    try:
        return _DUMPS(records, _PROTOCOL), []
    except Exception:  # noqa: BLE001 - find the records pickle cannot take
        pass
    kept: list[tuple] = []
    lost: list[tuple] = []
    for rec in records:
        try:
            _DUMPS(rec, _PROTOCOL)
            kept.append(rec)
        except Exception:  # noqa: BLE001 - an unpicklable attr or value: keep it as text
            try:
                kept.append(_plain_record(rec))
            except Exception:  # noqa: BLE001 - not even walkable: counted by the caller
                lost.append(rec)
    return _DUMPS(kept, _PROTOCOL), lost


def encode_one(record: tuple) -> bytes | tuple:
    """One compact record encoded alone (``marshal``), or the record itself when marshal
    cannot take it (``join_encoded`` then encodes its batch as ``encode_batch`` does). Encoding
    each record as its op ends costs about what its share of a batch does (1.2 vs 1.05 us on
    the issue-17 workload) and leaves no encode pause on any op."""
    try:
        return _MARSHAL(record, _MARSHAL_VERSION)
    except ValueError:
        return record


class Chunk(NamedTuple):
    """Records the native sink encoded (``Sink.take``): ``data`` is their ``encode_one``
    encodings, concatenated."""

    n: int
    data: bytes


def join_encoded(parts: list) -> tuple[bytes, list[tuple]]:
    """One blob, equal to ``encode_batch`` of the records, from the recorder's buffered parts
    (``encode_one`` results and ``Chunk`` s, oldest first): the marshal list header and the
    parts joined (marshal version 2 has no back-references, so a list's encoding is its header
    followed by its items'). Returns ``(blob, lost)``."""
    n = 0
    for p in parts:
        t = type(p)
        if t is bytes:
            n += 1
        elif t is Chunk:
            n += p.n
        else:  # a record marshal could not take: the whole batch as before
            return encode_batch([rec for part in parts for rec in part_records(part)])
    return b"[" + n.to_bytes(4, "little") + b"".join(
        p if type(p) is bytes else p.data for p in parts), []


def part_records(part: bytes | tuple | Chunk) -> list[tuple]:
    """The records one buffered part holds (see ``join_encoded``)."""
    if type(part) is bytes:
        return [_UNMARSHAL(part)]
    if type(part) is Chunk:
        return decode(b"[" + part.n.to_bytes(4, "little") + part.data)
    return [part]


def decode(blob: bytes) -> list[tuple]:
    """The compact records ``encode_batch`` encoded (pickle blobs start with the PROTO opcode
    0x80, which is no marshal type code)."""
    if blob[0] == 0x80:
        return _LOADS(blob)
    try:
        return _UNMARSHAL(blob)
    except ValueError:  # a record nested to marshal's depth limit: it loads alone, not one
        if blob[:1] != b"[":  # level deeper inside the batch's list
            raise
        return _one_by_one(blob[5:], int.from_bytes(blob[1:5], "little"))


def _one_by_one(data: bytes, n: int) -> list[tuple]:
    f = io.BytesIO(data)
    out = [marshal.load(f) for _ in range(n)]
    if f.tell() != len(data):
        raise ValueError(f"{len(data) - f.tell()} bytes after the batch's {n} records")
    return out


def decode_records(blobs: list[bytes]) -> tuple[list[CompactOp], list[tuple]]:
    """Compact ops and the flat mutation list from ``encode_batch`` blobs (recording order)."""
    ops: list[CompactOp] = []
    muts: list[tuple] = []
    new = tuple.__new__  # CompactOp(...) without its Python-level __new__ (writer hot path)
    for blob in blobs:
        for oid, name, start, end, req, par, sf, sl, attrs, err, ms in decode(blob):
            ops.append(new(CompactOp, (oid, name, start, end, req, par[0], par[1], par[2],
                                       par[3], sf, sl, attrs_dict(name, attrs),
                                       err)))
            if ms:
                muts.extend(ms)
    return ops, with_token_arrays(muts)


def with_token_arrays(muts: list) -> list:
    """``muts`` with each ``node.create``'s tokens as an ``array('Q')`` again.

    The cache hands a created node's key itself (an ``array('Q')``) and marshal encodes any
    buffer as ``bytes`` (0.1 us for a 214-token key, against 3 us to make it a tuple and 2.4
    us more to marshal that); the decoding side makes it an array again here (0.2 us). Tokens
    already an array (pickled batches, in-process rings) are kept. Returns ``muts`` itself
    when it has no such mutation, else a new list."""
    out = None
    for i, m in enumerate(muts):
        if m[2] == _NODE_CREATE and type(m[6][2]) is bytes:
            if out is None:
                out = list(muts)
            parent, extra_key, raw = m[6]
            toks = array(_TOKEN_CODE)
            toks.frombytes(raw)
            out[i] = (*m[:6], (parent, extra_key, toks))
    return muts if out is None else out


def named_records(records: list[tuple]) -> list[tuple[OpRecord, list[tuple]]]:
    """``OpRecord`` s (``context=None``) with their mutations, from compact records."""
    return [(OpRecord(oid, name, start, end, req, None, sf, sl, attrs_dict(name, attrs), err),
             with_token_arrays(list(ms or ())))
            for oid, name, start, end, req, _par, sf, sl, attrs, err, ms in records]


def _plain_record(rec: tuple) -> tuple:
    attrs = {str(k): _plain(v) for k, v in attrs_dict(rec[1], rec[8]).items()}
    muts = [tuple(m[:6]) + (_plain(m[6]),) for m in rec[10]]
    return (*rec[:8], attrs, rec[9], muts)


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str, array)):
        return v
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)


_DUMPS = pickle.dumps
_LOADS = pickle.loads
_MARSHAL = marshal.dumps
# version 2: no back-references. Version 4's reference table costs more than it saves on these
# records (an insert's token tuple: 2.4 us vs 3.7 us to encode, and faster to decode)
_MARSHAL_VERSION = 2
_UNMARSHAL = marshal.loads
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_NO_PARENT = (0, 0, 0, False)
# ``cache.keys.KEY_TYPECODE`` (not imported: that module imports torch, which the writer
# process never loads; a test checks they agree)
_TOKEN_CODE = "Q"


def _span_in(ctx: Any) -> Any:
    """The current span stored in a ``Context`` (None if none): a dict lookup, avoiding
    ``trace.get_current_span``'s ABC isinstance check on this per-op path."""
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
    from radixscope.telemetry.names import ATTR_OP_ID

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


def json_default(v: Any) -> Any:
    """What JSON cannot express: an array (a created node's tokens) as a list, a subclass of
    int / float / str (``TransferId``) as its plain value (msgspec asks for those; ``json``
    writes them itself), anything else as its ``repr``."""
    if isinstance(v, array):
        return v.tolist()
    for plain in (int, float, str):
        if isinstance(v, plain):
            return plain(v)
    return repr(v)


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_default, ensure_ascii=False)
# ``JSONEncoder.encode`` builds a C encoder on every call (about as costly as encoding a small
# tuple); build it once. Same output as ``_ENCODER.encode``; the pure-Python path is the fallback.
_C_ENCODE = (json.encoder.c_make_encoder(None, json_default, json.encoder.encode_basestring, None,
                                         ":", ",", False, False, True)
             if json.encoder.c_make_encoder is not None else None)


def dumps(value: Any) -> str:
    """Compact JSON; tuples become lists, anything JSON cannot express becomes its ``repr``
    (the json module: this stage runs in the cache's process; the store's writer uses the
    faster ``telemetry.store.jsontext.dumps``, which writes the same text)."""
    if type(value) is int:  # most mutation values (pool counts): skip the encoder
        return str(value)
    if _C_ENCODE is None or isinstance(value, str):
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def hex_ids(trace_id: int, span_id: int) -> tuple[str | None, str | None]:
    """OTel hex forms of a trace and span id (None for the invalid id 0)."""
    return (format(trace_id, "032x") if trace_id else None,
            format(span_id, "016x") if span_id else None)
