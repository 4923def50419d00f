"""Time travel: the tree at any seq (the store's keyframes + journal replay), and what changed
between two seqs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from radixscope.ui import context, data
from radixscope.ui.shaping import diff as diff_shape
from radixscope.ui.shaping import health
from radixscope.ui.views.tree_view import render_tree

ctx = context.require_store()
KEY = "tt"

last = ctx.last_seq()
first = int(data.reader(ctx.path).keyframes()["seq"].min())
asked = context.query_int("seq")
if asked is not None and st.session_state.get("tt.asked") != asked:
    st.session_state["tt.asked"] = asked
    st.session_state["tt.seq"] = min(max(asked, first), last)
    node = context.query_int("node")
    if node is not None:
        st.session_state[f"{KEY}.node"] = node

st.markdown("## Time travel")
if last <= first:
    st.info(f"The journal holds a single state (seq {last}).")
    seq = last
else:
    st.session_state["tt.seq"] = min(max(int(st.session_state.get("tt.seq", last)), first), last)
    seq = st.slider("Seq", first, last, key="tt.seq",
                    help="The tree right after this mutation: the nearest keyframe plus a replay "
                         "of the journal.")
ops = data.ops(ctx.path, last)
op = health.causing_op(ops, seq)
if op is not None:
    req = None if pd.isna(op["req_id"]) else op["req_id"]  # an op of no request: NaN in ops
    st.caption(f"state left by op {op['op_id']} `{op['op']}` "
               f"({f'request {req}, ' if req else 'no request, '}{op['details']})")
render_tree(ctx.path, seq, KEY)

st.markdown("### What changed")
prev = int(ops.loc[ops["seq"] < seq, "seq"].max()) if (ops["seq"] < seq).any() else first
lo, hi = st.slider("Compare seq A → B", first, last, (min(prev, seq), seq), key=f"tt.diff.{seq}")
d = diff_shape.diff_snapshots(data.snapshot(ctx.path, lo), data.snapshot(ctx.path, hi))
counts = d.counts()
cols = st.columns(len(counts))
for col, (k, v) in zip(cols, counts.items(), strict=True):
    col.metric(k.replace("_", " "), f"{v:,}")
if not d.changes.empty:
    st.markdown("**State changes per component and tier**")
    st.dataframe(d.change_matrix())
t1, t2, t3, t4 = st.tabs(["Nodes created / deleted", "State changes", "Locks", "Pools"])
with t1:
    a, b = st.columns(2)
    a.markdown("created")
    a.dataframe(d.created, hide_index=True)
    b.markdown("deleted")
    b.dataframe(d.deleted, hide_index=True)
    if not d.rekeyed.empty:
        st.markdown("re-keyed (split)")
        st.dataframe(d.rekeyed, hide_index=True)
with t2:
    st.dataframe(d.changes, hide_index=True)
with t3:
    st.dataframe(d.locks, hide_index=True)
with t4:
    st.dataframe(d.pools, hide_index=True)
