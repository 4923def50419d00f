"""Operations page: the cache ops (one span each) with filters and durations; select one to see
its mutations and jump to the tree it left."""

from __future__ import annotations

import streamlit as st

from radixscope.telemetry.analysis.miss.explain import explain_miss
from radixscope.ui import context, data
from radixscope.ui.shaping import ops as ops_shape

ctx = context.require_store()


@st.fragment(run_every=ctx.run_every)
def operations_body() -> None:
    seq = ctx.last_seq()
    table = data.ops(ctx.path, seq)
    st.markdown(f"## Operations ({len(table):,} ops, seq {seq:,})")
    if table.empty:
        st.info("No cache operation recorded yet.")
        return
    tab_ops, tab_spans = st.tabs(["Cache ops", "All spans"])
    with tab_ops:
        _ops(table)
    with tab_spans:
        _spans(seq)


def _ops(table) -> None:
    f1, f2, f3, f4 = st.columns([2.2, 1.2, 1.0, 0.8])
    names = f1.multiselect("Op", sorted(table["op"].unique()), key="ops.op")
    req = f2.selectbox("Request", [None, *sorted(r for r in table["req_id"].dropna().unique())],
                       key="ops.req")
    node = f3.number_input("Node", min_value=0, step=1, value=None, key="ops.node",
                           placeholder="id")
    errors = f4.toggle("Only errors", key="ops.err")
    lo, hi = float(table["t_ms"].min()), float(table["t_ms"].max())
    window = (st.slider("Time (ms since the first op)", lo, hi, (lo, hi), key="ops.t")
              if hi > lo else None)
    touching = (ops_shape.ops_touching(data.mutations(ctx.path, ctx.last_seq()), int(node))
                if node is not None else None)
    shown = ops_shape.filter_ops(table, names, req, None if node is None else int(node),
                                 touching, window, errors)
    st.caption(f"{len(shown):,} of {len(table):,} ops · select a row for its mutations")
    ev = st.dataframe(shown.drop(columns=["trace_id", "span_id"]), hide_index=True,
                      key="ops.table", on_select="rerun", selection_mode="single-row",
                      height=360, column_config={
                          "t_ms": st.column_config.NumberColumn("t (ms)", format="%.3f"),
                          "duration_us": st.column_config.NumberColumn("µs", format="%.1f")})
    rows = ev["selection"]["rows"] if ev else []
    if rows:
        op = shown.iloc[rows[0]]
        _op_detail(op)
    st.markdown("### Durations")
    st.dataframe(ops_shape.duration_stats(shown), hide_index=True)
    if not shown.empty:
        st.plotly_chart(ops_shape.duration_figure(shown), config={"displayModeBar": False})


def _op_detail(op) -> None:
    seq = int(op["seq"])
    st.markdown(f"**Op {op['op_id']}** `{op['op']}` · request {op['req_id']} · "
                f"{op['duration_us']:.1f} µs · left the tree at seq {seq:,}"
                + (f" · :red[{op['error']}]" if isinstance(op["error"], str) else ""))
    a, b, _ = st.columns([1, 1, 3])
    node = int(op["node"])
    qp = {"seq": str(seq), **({"node": str(node)} if node >= 0 else {})}
    if a.button("Tree at this seq", icon=":material/account_tree:", key="ops.to_tree"):
        st.switch_page("app_pages/tree.py", query_params=qp)
    if b.button("Time travel here", icon=":material/history:", key="ops.to_tt"):
        st.switch_page("app_pages/time_travel.py", query_params=qp)
    if op["op"] == "match" and op["req_id"] and st.button(
            "Why did this match stop here?", icon=":material/help:", key="ops.why"):
        _why(op)
    if op["mutations"]:
        muts = data.reader(ctx.path).mutations(seq - int(op["mutations"]) + 1, seq)
        st.dataframe(ops_shape.mutation_table(muts), hide_index=True, height=220)
    else:
        st.caption("This op changed nothing in the tree or the pools.")


def _why(op) -> None:
    """The miss explainer (``telemetry.analysis.miss.explain``) for the selected match op."""
    try:
        why = explain_miss(data.reader(ctx.path), str(op["req_id"]), op_id=int(op["op_id"]))
    except ValueError as e:
        st.warning(str(e))
        return
    st.code(why.text(), language=None)
    if why.reasons:
        st.dataframe(why.frame(), hide_index=True)


def _spans(seq: int) -> None:
    spans = data.spans(ctx.path, seq)
    names = st.multiselect("Span name", sorted(spans["name"].unique()), key="spans.name")
    shown = spans[spans["name"].isin(names)] if names else spans
    st.caption(f"{len(shown):,} of {len(spans):,} spans (cache ops and the host's own spans)")
    st.dataframe(shown, hide_index=True, height=420)


operations_body()
