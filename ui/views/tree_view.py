"""The tree panel shared by the Tree and Time-travel pages: drawing options, breadcrumb, the
side-by-side icicles, and the inspector of the selected node. Layout only; the data comes from
``ui.shaping``. ``key`` namespaces the widgets and the selection (``<key>.node``)."""

from __future__ import annotations

import streamlit as st

from radixscope.ui import data
from radixscope.ui.shaping import inspect as insp
from radixscope.ui.shaping import states as st_
from radixscope.ui.shaping.icicle import icicle_figure
from radixscope.ui.shaping.lod import lod_sectors, lod_summary, node_of_sector
from radixscope.ui.shaping.tree import ROOT_ID, TreeModel, node_label, state_summary

ALL = "all, side by side"
DETAIL = {"coarse": 0.01, "normal": 0.002, "fine": 0.0005}


def selected_node(model: TreeModel, key: str) -> int:
    """The selected node of panel ``key``, or the root when unset or absent at this seq."""
    nid = st.session_state.get(f"{key}.node", ROOT_ID)
    return nid if isinstance(nid, int) and model.has(nid) else ROOT_ID


def select(key: str, node: int) -> None:
    st.session_state[f"{key}.node"] = int(node)


def _on_sector(key: str, chart_key: str, focus: int, parent: int) -> None:
    pts = st.session_state[chart_key]["selection"]["points"]
    if not pts or pts[0].get("id") is None:
        return
    try:
        node = node_of_sector(pts[0]["id"])
    except ValueError:
        return
    if node == focus and focus != ROOT_ID and not str(pts[0]["id"]).startswith("fold-"):
        node = parent  # clicking the drawn root zooms out, as plotly does
    select(key, node)


def _on_row(key: str, table_key: str, ids: list[int]) -> None:
    rows = st.session_state[table_key]["selection"]["rows"]
    if rows:
        select(key, ids[rows[0]])


def _on_goto(key: str, input_key: str) -> None:
    v = st.session_state.get(input_key)
    if v is not None:
        st.session_state[f"{key}.goto"] = int(v)


def render_tree(path: str, seq: int, key: str) -> None:
    """Draw the tree of ``path`` at ``seq`` with its inspector."""
    model = data.model(path, seq)
    snap = data.snapshot(path, seq)
    goto = st.session_state.pop(f"{key}.goto", None)
    if goto is not None:
        if model.has(goto):
            select(key, goto)
        else:
            st.warning(f"node {goto} is not in the tree at seq {seq}")
    node = selected_node(model, key)
    parent = int(model.frame.at[node, "parent_id"]) if node != ROOT_ID else ROOT_ID
    focus = node if node == ROOT_ID or model.frame.at[node, "n_children"] > 0 else parent

    c1, c2, c3, c4, c5 = st.columns([2.2, 1.4, 1.2, 1.2, 1.0])
    choices = [ALL, *model.components] if len(model.components) > 1 else list(model.components)
    colour = c1.segmented_control("Colour by component", choices, default=choices[0],
                                  key=f"{key}.colour") or choices[0]
    depth = c2.slider("Depth window", 1, 16, 6, key=f"{key}.depth",
                      help="Levels drawn below the focus node.")
    detail = c3.select_slider("Detail", list(DETAIL), value="normal", key=f"{key}.detail",
                              help="Smaller subtrees are folded into '+N nodes' sectors.")
    budget = c4.selectbox("Max sectors", [500, 1000, 2000, 4000], index=2, key=f"{key}.max")
    c5.number_input("Go to node", min_value=0, step=1, value=None, key=f"{key}.goto_in",
                    on_change=_on_goto, args=(key, f"{key}.goto_in"), placeholder="id")

    crumbs = model.path_to_root(focus)[::-1]
    if len(crumbs) > 7:
        crumbs = crumbs[:1] + crumbs[-6:]
    st.pills("Path", crumbs, format_func=lambda n: node_label(model, n), default=focus,
             key=f"{key}.crumbs.{focus}", on_change=lambda: select(
                 key, st.session_state[f"{key}.crumbs.{focus}"] or focus),
             label_visibility="collapsed")

    comps = model.components if colour == ALL else (colour,)
    sectors = lod_sectors(model, focus, depth=depth, max_sectors=budget, min_share=DETAIL[detail])
    summ = lod_summary(model, sectors)
    shown = [s for s in st_.STATES
             if any((sectors[f"state_{c}"] == s).any() for c in comps)]
    st.markdown(st_.legend_html(shown), unsafe_allow_html=True)
    st.caption(f"seq {seq:,} · {model.n_nodes - 1:,} nodes · {model.total_tokens:,} tokens · "
               f"drawing {summ['sectors']:,} sectors ({summ['drawn_nodes']:,} nodes; "
               f"{summ['folded_nodes']:,} folded; {summ['nodes_below_window']:,} below the "
               "depth window) · click a sector to focus it, click the leftmost bar to go up")
    fig = icicle_figure(model, sectors, comps, height=560 if len(comps) > 1 else 600)
    chart_key = f"{key}.icicle.{focus}"
    st.plotly_chart(fig, key=chart_key, on_select=lambda: _on_sector(key, chart_key, focus,
                                                                     parent),
                    selection_mode="points", config={"displayModeBar": False})

    left, right = st.columns([1.15, 1.0], gap="large")
    with left:
        _inspector(model, snap, node, key)
    with right:
        st.markdown("**Path to the root**")
        g = insp.neighbourhood(model, node)
        st.graphviz_chart(insp.to_dot(g, comps[0]))
        _children_table(model, node, key)
    with st.expander("Nodes and tokens per state"):
        cols = st.columns(len(model.components))
        for col, c in zip(cols, model.components, strict=True):
            col.markdown(f"**{c}**")
            col.dataframe(state_summary(model, c).drop(columns="color"), hide_index=True)


def _inspector(model: TreeModel, snap, node: int, key: str) -> None:
    f = insp.node_facts(model, node)
    st.markdown(f"### {'Root' if node == ROOT_ID else f'Node #{node}'}")
    m = st.columns(4)
    m[0].metric("Own tokens", f"{f['tokens']:,}")
    m[1].metric("Prefix", f"{f['prefix_start']:,}–{f['prefix_end']:,}")
    m[2].metric("Subtree", f"{insp.compact(f['subtree_tokens'])} tok",
                f"{f['subtree_nodes']:,} nodes", delta_color="off",
                help=f"{f['subtree_tokens']:,} tokens")
    m[3].metric("Hits", f"{f['hits']:,}", f"last access {f['last_access']}", delta_color="off")
    if f["extra_key"] is not None:
        st.caption(f"namespace (extra key): {f['extra_key']}")
    if node == ROOT_ID:
        st.caption("The root holds no tokens and no data; select a node (click a sector or a "
                   "row of the children table) to inspect it.")
        return
    st.dataframe(insp.component_table(model, node), hide_index=True)
    for note in insp.state_notes(model, node):
        st.caption(note)
    holders = insp.lock_holders(snap, node)
    if holders.empty:
        st.caption("No lock pins this node.")
    else:
        st.markdown("**Locks pinning it**")
        st.dataframe(holders, hide_index=True)
    moving = insp.transfers_touching(snap, node)
    if not moving.empty:
        st.markdown("**Transfers in flight**")
        st.dataframe(moving, hide_index=True)
    st.markdown("**Tokens**")
    st.code(insp.token_preview(snap, node), language=None)


def _children_table(model: TreeModel, node: int, key: str) -> None:
    kids = model.children(node)
    if not kids:
        st.caption("A leaf: no children.")
        return
    shown = kids[:500]
    cols = ["tokens", "subtree_tokens", "subtree_nodes", "hits", "last_access",
            *[f"state_{c}" for c in model.components]]
    df = model.frame.loc[shown, cols].reset_index()
    st.markdown(f"**Children** ({len(kids):,}{', largest 500 shown' if len(kids) > 500 else ''})"
                " · select a row to inspect it")
    tkey = f"{key}.children.{node}"
    st.dataframe(df, key=tkey, hide_index=True, height=260,
                 on_select=lambda: _on_row(key, tkey, shown), selection_mode="single-row")
