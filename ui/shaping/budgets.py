"""Budgets: every pool (component x tier) over time, and the admission decisions.

A pool's slots always split into ``available + evictable + protected + held = capacity``
(``held``: rows requests own outside the tree). A transfer pins the tree nodes it copies, so its
``in_flight`` slots are part of ``protected``, except a copy into a request's private slot (a
MAMBA copy-on-write load-back), which is part of ``held``. The stack drawn is available,
evictable, protected (settled), in flight (the pinned part), held: it sums to the capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from radixscope.cache.components import rules
from radixscope.cache.snapshot import CacheSnapshot
from radixscope.cache.tiers import TIER_LABELS
from radixscope.telemetry.store.journal import Journal

STACK = ("available", "evictable", "protected", "in_flight", "held")
STACK_COLORS = {"available": "#ced4da", "evictable": "#2a9d8f", "protected": "#e4572e",
                "in_flight": "#9b5de5", "held": "#e9b949"}
STACK_WORDS = {"available": "free", "evictable": "evictable (cached, unpinned)",
               "protected": "protected (locked / host-referenced)",
               "in_flight": "in flight (copy not acked)", "held": "held by requests"}


def budget_series(metrics: pd.DataFrame, component: str, tier: str) -> pd.DataFrame:
    """One pool's samples as the drawn stack, indexed by seq (the last sample per seq).

    Returns:
        Columns ``capacity`` plus ``STACK``; ``in_flight`` is capped at ``protected`` (the rest
        is in ``held``) and ``protected`` excludes it; negative parts (a broken ledger) are
        clipped to 0 here and reported by the health page.

    Raises:
        ValueError: no samples for that pool, naming it.
    """
    m = metrics[(metrics["component"] == component) & (metrics["tier"] == tier)]
    if m.empty:
        have = sorted({f"{c}/{t}" for c, t in zip(metrics.get("component", []),
                                                  metrics.get("tier", []), strict=False)})
        raise ValueError(f"no metric samples for pool {component}/{tier}; have {have}")
    m = m.drop_duplicates("seq", keep="last").set_index("seq").sort_index()
    held = m["capacity"] - m["available"] - m["evictable"] - m["protected"]
    flying = m["in_flight"].clip(lower=0).where(m["in_flight"] <= m["protected"],
                                                m["protected"].clip(lower=0))
    out = pd.DataFrame({
        "capacity": m["capacity"], "available": m["available"], "evictable": m["evictable"],
        "protected": (m["protected"] - flying).clip(lower=0), "in_flight": flying,
        "held": held.clip(lower=0),
    })
    return out.astype("int64")


def present_tiers(metrics: pd.DataFrame) -> tuple[str, ...]:
    """The tiers with samples in ``metrics`` (a ``tier`` column), in tier order."""
    if "tier" not in metrics:
        return ()
    have = set(metrics["tier"].unique())
    return tuple(t for t in TIER_LABELS if t in have)


def budget_figure(metrics: pd.DataFrame, components: tuple[str, ...],
                  tiers: tuple[str, ...] | None = None, height_per_row: int = 190
                  ) -> go.Figure:
    """A grid (rows: components, columns: tiers) of stacked areas over seq. ``tiers``
    defaults to every tier with samples in ``metrics``, in tier order."""
    if tiers is None:
        tiers = present_tiers(metrics)
    fig = make_subplots(rows=len(components), cols=len(tiers), shared_xaxes=True,
                        subplot_titles=[f"{c} / {t}" for c in components for t in tiers],
                        vertical_spacing=0.08, horizontal_spacing=0.06)
    for i, c in enumerate(components):
        for j, t in enumerate(tiers):
            s = budget_series(metrics, c, t)
            for part in STACK:
                fig.add_trace(go.Scatter(
                    x=s.index, y=s[part], name=STACK_WORDS[part], legendgroup=part,
                    showlegend=(i == 0 and j == 0), stackgroup=f"{c}/{t}", mode="lines",
                    line={"width": 0.5, "color": STACK_COLORS[part]},
                    fillcolor=STACK_COLORS[part],
                    hovertemplate=f"{STACK_WORDS[part]}: %{{y}}<extra>{c}/{t}</extra>"),
                    row=i + 1, col=j + 1)
    fig.update_layout(height=height_per_row * len(components) + 90, hovermode="x unified",
                      margin={"l": 8, "r": 8, "t": 64, "b": 8},
                      legend={"orientation": "h", "yanchor": "top", "yref": "container",
                              "y": 0.995, "x": 0})
    fig.update_xaxes(title_text="seq", row=len(components))
    return fig


METRIC_COLUMNS = ("seq", "ts_ns", "component", "tier", "capacity", "available", "evictable",
                  "protected", "in_flight")


def replayed_pools(start: CacheSnapshot, mutations: Sequence[tuple], points: int = 400
                   ) -> pd.DataFrame:
    """Pool ledgers rebuilt from the journal (``radixscope.telemetry.store.journal.Journal``), in the shape of
    ``StoreReader.metrics()``: one row per pool at ``start.seq``, then after roughly every
    ``ceil(len(mutations) / points)`` mutations, always at the end of an op (a state half way
    through an op is not one the cache was ever seen in), and after the last mutation. Exact
    where the store's own samples are sparse; ``ts_ns`` is None.

    Raises:
        ValueError: ``points`` < 1.
    """
    if points < 1:
        raise ValueError(f"points={points!r}: must be >= 1")
    j = Journal(start)
    rows = [(j.seq, None, *p) for p in j.pools()]
    every = max(1, -(-len(mutations) // points))
    chunk: list[tuple] = []
    for k, m in enumerate(mutations):
        chunk.append(m)
        last = k == len(mutations) - 1
        if last or (len(chunk) >= every and mutations[k + 1][1] != m[1]):
            j.accept(chunk)
            chunk = []
            rows += [(j.seq, None, *p) for p in j.pools()]
    return pd.DataFrame(rows, columns=list(METRIC_COLUMNS))


def budget_table(snap: CacheSnapshot) -> pd.DataFrame:
    """The pools of one snapshot: ``component, tier, unit, capacity, available, evictable,
    protected, in_flight, held, used_pct`` (held may be negative when a ledger is broken)."""
    rows = []
    for p in snap.pools:
        used = p.capacity - p.available
        rows.append((p.component, p.tier, rules(p.component).unit,
                     p.capacity, p.available, p.evictable, p.protected, p.in_flight, p.held,
                     round(100.0 * used / p.capacity, 1) if p.capacity else 0.0))
    return pd.DataFrame(rows, columns=["component", "tier", "unit", "capacity", "available",
                                       "evictable", "protected", "in_flight", "held",
                                       "used_pct"])


# ---- admissions ------------------------------------------------------------------------------
def admissions_table(events: pd.DataFrame) -> pd.DataFrame:
    """Admission events (``kind == "admission"``) as ``seq, req_id, admitted, verdict,
    blocking, reason``.

    ``verdict`` is ``admitted``, ``refused`` (did not fit now; the request waits) or
    ``rejected`` (``attrs["rejected"]``: it can never fit). ``blocking`` names the components
    that did not fit: from a ``components`` dict (``Admission.as_dict()``: need > headroom) when
    present, else parsed from a ``refused: ...`` reason (``ComponentNeed.explain`` parts start
    with the component name).
    """
    cols = ["seq", "req_id", "admitted", "verdict", "blocking", "reason"]
    if events.empty:
        return pd.DataFrame(columns=cols)
    ev = events[events["kind"] == "admission"]
    rows = []
    for seq, attrs in zip(ev["seq"], ev["attrs"], strict=True):
        a = attrs if isinstance(attrs, dict) else {}
        admitted = bool(a.get("admitted", a.get("fits", False)))
        verdict = "admitted" if admitted else "rejected" if a.get("rejected") else "refused"
        reason = str(a.get("reason", ""))
        rows.append((None if pd.isna(seq) else int(seq), a.get("req_id"), admitted, verdict,
                     "" if admitted else ", ".join(_blocking(a, reason)), reason))
    return pd.DataFrame(rows, columns=cols)


def _blocking(attrs: dict, reason: str) -> list[str]:
    comps = attrs.get("components")
    if isinstance(comps, dict):
        return [c for c, d in comps.items()
                if isinstance(d, dict) and d.get("need", 0) > d.get("headroom", 0)]
    body = reason.split(":", 1)[1] if reason.startswith(("refused:", "rejected:")) else ""
    return [part.split(":", 1)[0].strip() for part in body.split(";") if ":" in part]


def admission_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Counts per verdict and blocking components: ``verdict, blocking, count``."""
    if table.empty:
        return pd.DataFrame(columns=["verdict", "blocking", "count"])
    out = table[["verdict", "blocking"]].value_counts().rename("count").reset_index()
    return out.sort_values(["verdict", "count", "blocking"], ascending=[True, False, True]
                           ).reset_index(drop=True)


def failed_ops(ops_table: pd.DataFrame) -> pd.DataFrame:
    """Ops that raised, grouped by op and error type: ``op, error_type, count, first_seq,
    example`` (e.g. ``alloc`` / ``CacheOutOfMemory`` with the first message)."""
    cols = ["op", "error_type", "count", "first_seq", "example"]
    bad = ops_table[ops_table["error"].notna()]
    if bad.empty:
        return pd.DataFrame(columns=cols)
    bad = bad.assign(error_type=bad["error"].str.split(":", n=1).str[0])
    g = bad.sort_values("seq").groupby(["op", "error_type"])
    out = pd.DataFrame({"count": g.size(), "first_seq": g["seq"].min(),
                        "example": g["error"].first()}).reset_index()
    return out[cols]
