"""radixscope UI entrypoint: ``streamlit run ui/app.py -- --store STORE``.

Routes the pages in ``ui/app_pages/`` with ``st.navigation`` and keeps the store choice and the
live-refresh setting in the sidebar. Pages are thin: they call ``ui.shaping`` functions.
"""

from __future__ import annotations

import os
import sys

import streamlit as st

from radixscope.ui import context
from radixscope.ui.store_arg import looks_live, store_from_args

st.set_page_config(page_title="radixscope", page_icon=":material/account_tree:", layout="wide")

if context.PATH_KEY not in st.session_state:
    st.session_state[context.PATH_KEY] = store_from_args(sys.argv[1:], os.environ) or ""

pages = [
    st.Page("app_pages/tree.py", title="Tree", icon=":material/account_tree:", default=True,
            url_path="tree"),
    st.Page("app_pages/budgets.py", title="Budgets", icon=":material/stacked_line_chart:",
            url_path="budgets"),
    st.Page("app_pages/operations.py", title="Operations", icon=":material/list_alt:",
            url_path="operations"),
    st.Page("app_pages/time_travel.py", title="Time travel", icon=":material/history:",
            url_path="time_travel"),
    st.Page("app_pages/health.py", title="Health", icon=":material/health_and_safety:",
            url_path="health"),
]
nav = st.navigation(pages)

with st.sidebar:
    st.text_input("Telemetry store", key=context.PATH_KEY, placeholder="runs/run.db",
                  help="A radixscope telemetry store (SQLite). Opened read-only.")
    path = str(st.session_state[context.PATH_KEY]).strip()
    err = context.open_error(path)
    if path and err is None:
        path = context.confine(path, context.store_root())  # what open_error checked
        if context.LIVE_KEY not in st.session_state:
            st.session_state[context.LIVE_KEY] = looks_live(path)
        st.toggle("Live", key=context.LIVE_KEY,
                  help="Refresh from the store while a run is still writing it.")
        if st.session_state[context.LIVE_KEY]:
            st.select_slider("Refresh every (s)", options=[1.0, 2.0, 5.0, 10.0], value=2.0,
                             key=context.REFRESH_KEY)
        live = bool(st.session_state[context.LIVE_KEY])

        @st.fragment(run_every=st.session_state.get(context.REFRESH_KEY, 2.0) if live else None)
        def store_caption() -> None:
            st.caption(f"last seq {context.StoreCtx(path, live, 2.0).last_seq():,}")

        store_caption()

nav.run()
