"""The operations view: one row per cache op (each is one span), filters, duration statistics.

Input frames are ``StoreReader.ops()``, ``.mutations()`` and ``.spans()``. An op's ``seq`` is its
``seq_last``: the journal seq right after it, so ``state_at(seq)`` is the tree the op left
(an op that changed nothing has ``seq_last = seq_first - 1``, the seq it saw).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from radixscope.cache import events as ev

OP_COLUMNS = ("op_id", "op", "req_id", "node", "t_ms", "duration_us", "seq", "mutations",
              "error", "details", "trace_id", "span_id")
_DETAIL_SKIP = {ev.A_NODE}


def ops_table(ops: pd.DataFrame, t0_ns: int | None = None) -> pd.DataFrame:
    """Shape ``StoreReader.ops()`` for display.

    Args:
        ops: the store's op rows (``attrs`` decoded).
        t0_ns: time origin; default the first op's start.

    Returns:
        ``OP_COLUMNS``: ``node`` is the op's node attribute (-1 when it has none), ``t_ms`` the
        start relative to ``t0_ns``, ``details`` the other attributes as ``k=v`` text.
    """
    if ops.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in OP_COLUMNS})
    t0 = int(ops["start_ns"].min()) if t0_ns is None else int(t0_ns)
    attrs = ops["attrs"].tolist()
    out = pd.DataFrame({
        "op_id": ops["op_id"].astype("int64"), "op": ops["op"], "req_id": ops["req_id"],
        "node": [_node(a) for a in attrs],
        "t_ms": (ops["start_ns"] - t0) / 1e6,
        "duration_us": (ops["end_ns"] - ops["start_ns"]) / 1e3,
        "seq": ops["seq_last"].astype("int64"),
        "mutations": (ops["seq_last"] - ops["seq_first"] + 1).clip(lower=0).astype("int64"),
        "error": ops["error"],
        "details": [_details(a) for a in attrs],
        "trace_id": ops["trace_id"], "span_id": ops["span_id"],
    })
    return out.reset_index(drop=True)


def _node(attrs: object) -> int:
    if isinstance(attrs, dict):
        v = attrs.get(ev.A_NODE)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return -1


def _details(attrs: object) -> str:
    if not isinstance(attrs, dict):
        return ""
    return ", ".join(f"{k}={v}" for k, v in attrs.items()
                     if k not in _DETAIL_SKIP and v is not None)


def ops_touching(mutations: pd.DataFrame, node: int) -> set[int]:
    """Op ids whose mutations touched ``node``: it was the mutation's node, a split's new
    parent, or among a lock's pinned nodes."""
    if mutations.empty:
        return set()
    hit = set(mutations.loc[mutations["node"] == node, "op_id"].astype(int))
    for kind, op_id, value in zip(mutations["kind"], mutations["op_id"], mutations["value"],
                                  strict=True):
        if kind == ev.NODE_SPLIT and value and value[0] == node:
            hit.add(int(op_id))
        elif kind in (ev.LOCK_ACQUIRE, ev.LOCK_RELEASE):
            pins = value[2] if kind == ev.LOCK_ACQUIRE else value[1]
            if any(node in ids for _c, ids in pins):
                hit.add(int(op_id))
    return hit


def filter_ops(table: pd.DataFrame, ops: list[str] | tuple[str, ...] = (),
               req_id: str | None = None, node: int | None = None,
               touching: set[int] | None = None, t_ms: tuple[float, float] | None = None,
               errors_only: bool = False) -> pd.DataFrame:
    """Rows of ``ops_table`` matching every given filter.

    Args:
        ops: op names to keep (empty = all).
        req_id: only this request's ops.
        node: only ops naming this node (``node`` column) or listed in ``touching``.
        touching: op ids that touched ``node`` (``ops_touching``).
        t_ms: inclusive start-time window in ms.
        errors_only: only ops that raised.
    """
    m = pd.Series(True, index=table.index)
    if ops:
        m &= table["op"].isin(list(ops))
    if req_id:
        m &= table["req_id"] == req_id
    if node is not None:
        hit = table["node"] == node
        if touching:
            hit |= table["op_id"].isin(list(touching))
        m &= hit
    if t_ms is not None:
        m &= table["t_ms"].between(t_ms[0], t_ms[1])
    if errors_only:
        m &= table["error"].notna()
    return table[m]


def duration_stats(table: pd.DataFrame) -> pd.DataFrame:
    """Per op name: ``count, mean_us, p50_us, p95_us, max_us, errors``, most frequent first."""
    cols = ["op", "count", "mean_us", "p50_us", "p95_us", "max_us", "errors"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    g = table.groupby("op")
    d = g["duration_us"]
    out = pd.DataFrame({
        "count": d.size(), "mean_us": d.mean(), "p50_us": d.quantile(0.5),
        "p95_us": d.quantile(0.95), "max_us": d.max(),
        "errors": g["error"].apply(lambda s: int(s.notna().sum())),
    }).reset_index()
    return out.sort_values(["count", "op"], ascending=[False, True])[cols].reset_index(drop=True)


def duration_figure(table: pd.DataFrame) -> go.Figure:
    """Op durations (µs, log scale) per op name as box plots with every point."""
    fig = go.Figure()
    for op in sorted(table["op"].unique()):
        d = table.loc[table["op"] == op, "duration_us"]
        fig.add_trace(go.Box(y=d, name=op, boxpoints="all", jitter=0.4, pointpos=0,
                             marker={"size": 3}, line={"width": 1}))
    fig.update_layout(yaxis={"type": "log", "title": "duration (µs)"}, showlegend=False,
                      height=320, margin={"l": 8, "r": 8, "t": 8, "b": 8})
    return fig


def span_table(spans: pd.DataFrame) -> pd.DataFrame:
    """Every stored span (cache and host): ``name, t_ms, duration_us, status, op_id, trace_id,
    span_id, parent_span_id, attributes``, times relative to the first span."""
    cols = ["name", "t_ms", "duration_us", "status", "op_id", "trace_id", "span_id",
            "parent_span_id", "attributes"]
    if spans.empty:
        return pd.DataFrame(columns=cols)
    t0 = int(spans["start_ns"].min())
    return pd.DataFrame({
        "name": spans["name"], "t_ms": (spans["start_ns"] - t0) / 1e6,
        "duration_us": (spans["end_ns"] - spans["start_ns"]) / 1e3,
        "status": spans["status_code"], "op_id": spans["op_id"],
        "trace_id": spans["trace_id"], "span_id": spans["span_id"],
        "parent_span_id": spans["parent_span_id"],
        "attributes": [", ".join(f"{k}={v}" for k, v in (a or {}).items())
                       for a in spans["attributes"]],
    }).reset_index(drop=True)


def mutation_table(mutations: pd.DataFrame) -> pd.DataFrame:
    """Journal rows for display: ``seq, kind, node, comp, tier, value`` (value as text)."""
    cols = ["seq", "kind", "node", "comp", "tier", "value"]
    if mutations.empty:
        return pd.DataFrame(columns=cols)
    out = mutations[["seq", "kind", "node", "comp", "tier"]].copy()
    out["value"] = [_short(v) for v in mutations["value"]]
    return out.reset_index(drop=True)


def _short(v: object, limit: int = 120) -> str:
    s = str(v)
    return s if len(s) <= limit else s[:limit - 1] + "…"
