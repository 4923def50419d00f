"""Cached store access for the pages (the only module besides the pages that uses streamlit's
caches). The reader is one shared read-only handle per path (``cache_resource``); tables are
keyed by ``(path, stamp)`` where the stamp is the store's last seq, so a growing store refreshes
and an idle one is read once; trees are keyed by ``(path, seq)`` so time travel caches."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cache.snapshot import CacheSnapshot
from telemetry import StoreReader, open_store
from ui.shaping import budgets as bud
from ui.shaping import ops as ops_shape
from ui.shaping.tree import TreeModel, tree_model


@st.cache_resource(max_entries=4, show_spinner=False)
def reader(path: str) -> StoreReader:
    """The shared read-only reader of ``path`` (thread-safe: it serialises its queries)."""
    return open_store(path)


def last_seq(path: str) -> int:
    return reader(path).last_seq()


@st.cache_resource(max_entries=16, show_spinner="Rebuilding the tree at that seq…")
def snapshot(path: str, seq: int) -> CacheSnapshot:
    return reader(path).state_at(seq)


@st.cache_resource(max_entries=8, show_spinner=False)
def model(path: str, seq: int) -> TreeModel:
    return tree_model(snapshot(path, seq))


@st.cache_data(max_entries=8, show_spinner=False)
def info(path: str, stamp: int) -> dict:
    return reader(path).info()


@st.cache_data(max_entries=4, show_spinner=False)
def ops(path: str, stamp: int) -> pd.DataFrame:
    return ops_shape.ops_table(reader(path).ops())


@st.cache_data(max_entries=4, show_spinner=False)
def mutations(path: str, stamp: int) -> pd.DataFrame:
    return reader(path).mutations()


@st.cache_data(max_entries=4, show_spinner=False)
def metrics(path: str, stamp: int) -> pd.DataFrame:
    return reader(path).metrics()


@st.cache_data(max_entries=4, show_spinner=False)
def events(path: str, stamp: int) -> pd.DataFrame:
    return reader(path).events()


@st.cache_data(max_entries=4, show_spinner=False)
def violations(path: str, stamp: int) -> pd.DataFrame:
    return reader(path).violations()


@st.cache_data(max_entries=4, show_spinner=False)
def spans(path: str, stamp: int) -> pd.DataFrame:
    return ops_shape.span_table(reader(path).spans())


@st.cache_data(max_entries=4, show_spinner="Replaying the journal…")
def replayed_metrics(path: str, stamp: int, points: int = 400) -> pd.DataFrame:
    """Pool ledgers after every slice of the journal, from its first keyframe to ``stamp``."""
    r = reader(path)
    first = int(r.keyframes()["seq"].min())
    return bud.replayed_pools(r.keyframe(first), r.journal(first + 1, stamp), points)
