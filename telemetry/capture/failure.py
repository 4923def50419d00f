"""What a crash bundle says about the failure itself: the exception, its traceback, the numbers.

Everything here becomes plain JSON-able data (strings, numbers, lists): a bundle never holds a
pickled object, so opening one never runs code from it. Locals of the failing frames are kept as
truncated ``repr`` strings, like a crash reporter does, and the node the failure is about is
found in this order: the failing op's own ``node`` attribute, the first violation that names a
node, the innermost cache frame holding a tree node (``anchor``, ``node``...).
"""

from __future__ import annotations

import traceback
from types import TracebackType
from typing import Any

import torch

from radixscope.cache.errors import CacheOutOfMemory, InvariantViolation
from radixscope.cache.events import A_NODE
from radixscope.cache.tree import Node

_REPR_MAX = 200
_NODE_LOCALS = ("anchor", "node", "leaf", "victim", "child", "n")


def describe(exc: BaseException | None, op: str | None = None,
             attrs: dict | None = None, *, rule: str | None = None, nodes=None) -> dict:
    """Plain-data description of a failure.

    Args:
        exc: the exception (None for an on-demand bundle).
        op: the cache operation that raised (None when unknown or on demand).
        attrs: the failing op's recorded attributes, if any.
        rule: the broken rule; default the first violation's name, else ``exc.rule``.
        nodes: the node ids involved; default every node the violations name, else
            ``exc.nodes``.

    Returns:
        ``{"op", "exception", "message", "traceback", "frames", "node", "nodes", "rule",
        "violations", "oom"}``.
    """
    out: dict[str, Any] = {"op": op, "exception": None, "message": None, "traceback": [],
                           "frames": [], "node": None, "nodes": [], "rule": rule,
                           "violations": [], "oom": None}
    if exc is None:
        out["nodes"] = [int(n) for n in nodes or ()]
        return out
    out["exception"] = type(exc).__name__
    out["message"] = str(exc)
    out["traceback"] = traceback.format_exception(type(exc), exc, exc.__traceback__)
    out["frames"] = frames(exc.__traceback__)
    if isinstance(exc, InvariantViolation):
        out["violations"] = violation_rows(exc)
    if isinstance(exc, CacheOutOfMemory):
        out["oom"] = {k: getattr(exc, k) for k in ("component", "tier", "requested", "available",
                                                   "evictable", "protected")}
    if out["rule"] is None:
        named = getattr(exc, "rule", None)
        out["rule"] = out["violations"][0][0] if out["violations"] else (
            str(named) if isinstance(named, str) else None)
    given = nodes is not None
    if not given:
        nodes = [v[1] for v in out["violations"] if v[1] is not None] or list(
            n for n in getattr(exc, "nodes", ()) or () if isinstance(n, int))
    out["nodes"] = list(dict.fromkeys(int(n) for n in nodes))  # first named first
    out["node"] = _node_of(attrs, out["violations"], exc.__traceback__)
    if out["nodes"] and (given or out["node"] is None):
        out["node"] = out["nodes"][0]
    return out


def violation_rows(exc: InvariantViolation) -> list[list]:
    """``[[name, node, detail], ...]`` of an ``InvariantViolation``."""
    return [[str(name), None if node is None else int(node), str(detail)]
            for name, node, detail in exc.violations]


def frames(tb: TracebackType | None) -> list[dict]:
    """One dict per frame (outermost first): file, line, function, source line and locals as
    truncated reprs."""
    out = []
    for frame, lineno in traceback.walk_tb(tb):
        code = frame.f_code
        loc = {}
        for k, v in frame.f_locals.items():
            loc[k] = _short_repr(v)
        out.append({"file": code.co_filename, "line": lineno, "function": code.co_name,
                    "source": _source(code.co_filename, lineno), "locals": loc})
    return out


def _short_repr(v: object) -> str:
    try:
        r = repr(v)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not break the bundle
        r = f"<repr failed: {type(e).__name__}>"
    return r if len(r) <= _REPR_MAX else r[:_REPR_MAX - 3] + "..."


def _source(filename: str, lineno: int) -> str:
    import linecache

    return linecache.getline(filename, lineno).strip()


def _node_of(attrs: dict | None, violations: list[list], tb: TracebackType | None) -> int | None:
    if attrs and isinstance(attrs.get(A_NODE), int):
        return int(attrs[A_NODE])
    for _name, node, _detail in violations:
        if node is not None:
            return node
    found = None
    for frame, _ in traceback.walk_tb(tb):
        for name in _NODE_LOCALS:
            v = frame.f_locals.get(name)
            if isinstance(v, Node):
                found = v.id  # innermost wins
                break
    return found


def cuda_memory(device: str, snapshot: bool) -> dict | None:
    """Torch's CUDA memory figures for a CUDA cache, else None.

    Args:
        device: the cache's device string.
        snapshot: also take ``torch.cuda.memory._snapshot()`` (segments and, when
            ``torch.cuda.memory._record_memory_history`` is on, the allocation trace).
    """
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    out: dict[str, Any] = {"device": device,
                           "stats": dict(torch.cuda.memory_stats(device)),
                           "reserved": torch.cuda.memory_reserved(device),
                           "allocated": torch.cuda.memory_allocated(device)}
    if snapshot:
        out["snapshot"] = torch.cuda.memory._snapshot()
    return out
