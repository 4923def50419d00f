"""What every page needs: the chosen store, its latest seq, and the live-refresh setting.

The entrypoint's sidebar writes ``st.session_state["store_path"]``, ``["live"]`` and
``["refresh_s"]``; ``require_store`` reads them, opens the store (read-only, shared) and stops
the page with a one-line message when there is no usable store.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import streamlit as st

from radixscope.ui import data
from radixscope.ui.store_arg import confine, root_from_args

PATH_KEY = "store_path"
LIVE_KEY = "live"
REFRESH_KEY = "refresh_s"


@dataclass(frozen=True)
class StoreCtx:
    path: str
    live: bool
    refresh_s: float

    @property
    def run_every(self) -> float | None:
        """The fragment refresh period: the chosen interval in live mode, else None."""
        return self.refresh_s if self.live else None

    def last_seq(self) -> int:
        return data.last_seq(self.path)


def store_root() -> str:
    """The folder this app may open stores under (``--root`` / the store's folder / cwd)."""
    return root_from_args(sys.argv[1:], os.environ)


def open_error(path: str, root: str | None = None) -> str | None:
    """Why ``path`` cannot be shown (one line), or None when it lies under the root (``root``,
    default ``store_root()``), opens, and holds a journal. A path outside the root is refused
    before anything looks at it."""
    if not path:
        return ("No store chosen: enter a telemetry store path in the sidebar "
                "(or start with `radixscope ui STORE`).")
    try:
        full = confine(path, store_root() if root is None else root)
    except ValueError as e:
        return str(e)
    try:
        data.reader(full).last_seq()
    except (FileNotFoundError, ValueError) as e:
        return str(e)
    return None


def require_store() -> StoreCtx:
    """The current store, or a message and ``st.stop()``."""
    path = str(st.session_state.get(PATH_KEY, "") or "").strip()
    err = open_error(path)
    if err is not None:
        if path:
            st.error(err)
        else:
            st.info(err)
        st.stop()
    return StoreCtx(confine(path, store_root()), bool(st.session_state.get(LIVE_KEY, False)),
                    float(st.session_state.get(REFRESH_KEY, 2.0)))


def query_int(name: str) -> int | None:
    """An int query parameter (``?seq=12``), or None when absent or not an int."""
    v = st.query_params.get(name)
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None
