"""The attributes of an op's span, decoded from the op record's fields.

Both sides read this: the span sink puts them on the spans it builds (``telemetry/sinks/spans.py``)
and the store reader renders a stored op row as the same span (``telemetry/store/reader.py``),
so a span read back from the store carries exactly the attributes an exporter saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from radixscope.telemetry import names as n

_SCALARS = (bool, int, float, str)


class OpFields(Protocol):
    """The fields of an op record the attributes come from (``CompactOp`` has them)."""

    op_id: int
    op: str
    seq_first: int
    seq_last: int
    req_id: Any
    attrs: Mapping[str, Any]
    error: str | None


def span_attributes(op: OpFields) -> dict[str, Any]:
    """The attributes of an op's span: the fixed ones plus the op record's ``attrs`` mapped
    through ``names.attribute_name`` (a per-component dict becomes one attribute per component).

    Args:
        op: the op record (a ``CompactOp``, or anything with its fields).

    Returns:
        A dict of OTel-valid attribute values (None values are left out).
    """
    return op_attributes(op.op_id, op.op, op.seq_first, op.seq_last, op.req_id, op.attrs,
                         op.error)


def op_attributes(op_id: int, op: str, seq_first: int, seq_last: int, req_id: object,
                  attrs: Mapping[str, Any], error: str | None) -> dict[str, Any]:
    """``span_attributes`` from the fields of an op record (a store row's, say)."""
    out: dict[str, Any] = {
        n.ATTR_OP_ID: op_id,
        n.ATTR_SEQ: seq_last,
        n.ATTR_OP_MUTATIONS: max(0, seq_last - seq_first + 1),
    }
    if req_id is not None:
        out[n.ATTR_REQUEST_ID] = str(req_id)
    for key, value in attrs.items():
        if value is None:
            continue
        name = n.attribute_name(op, key)
        per_comp = _as_mapping(value)
        if per_comp is not None:
            for comp, v in per_comp.items():
                out[f"{name}.{_snake(str(comp))}"] = _attr_value(v)
        else:
            out[name] = _attr_value(value)
    if error:
        out[n.ATTR_ERROR_TYPE] = error_type(error)
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
