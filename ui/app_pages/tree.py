"""Tree page: the radix tree now (live) or at ``?seq=N``, focused on ``?node=M``."""

from __future__ import annotations

import streamlit as st

from radixscope.ui import context
from radixscope.ui.views.tree_view import render_tree, select

ctx = context.require_store()
KEY = "tree"

pinned = context.query_int("seq")
asked = context.query_int("node")
if asked is not None and st.session_state.get(f"{KEY}.asked") != asked:
    st.session_state[f"{KEY}.asked"] = asked  # apply a ?node= link once
    select(KEY, asked)


@st.fragment(run_every=None if pinned is not None else ctx.run_every)
def tree_body() -> None:
    last = ctx.last_seq()
    seq = last if pinned is None or pinned > last else pinned
    head, btn = st.columns([5, 1])
    head.markdown(f"## Radix tree at seq {seq:,}"
                  + ("" if pinned is None else f"  \n:gray[pinned from a link; latest is "
                                                f"{last:,}]"))
    if pinned is not None and btn.button("Follow latest", icon=":material/update:"):
        st.query_params.pop("seq", None)
        st.rerun()
    render_tree(ctx.path, seq, KEY)


tree_body()
