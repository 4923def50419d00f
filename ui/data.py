"""Cached store access for the pages (the only module besides the pages that uses streamlit's
caches). The reader is one shared read-only handle per store file (``cache_resource``); tables
are keyed by ``(path, identity, stamp)`` where the stamp is the store's last seq, so a growing
store refreshes and an idle one is read once; trees are keyed by ``(path, identity, seq)`` so
time travel caches.

The identity is the file's (device, inode) (``store_identity``): a new run writes a new store
and renames it over the old one, so the same path then names another file. Every call looks at
the path again, so the pages switch to the new run on their next rerun instead of showing the
old one from the cached reader (which still holds the replaced file open, so its inode number
cannot be reused while it is cached)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry import StoreReader, open_store
from radixscope.ui.shaping import budgets as bud
from radixscope.ui.shaping import ops as ops_shape
from radixscope.ui.shaping.tree import TreeModel, tree_model

Identity = tuple[int, int] | None


def store_identity(path: str) -> Identity:
    """The (device, inode) of the file at ``path`` now, or None when there is none: it changes
    when a new run's store replaces the file."""
    try:
        st_ = os.stat(path)
    except OSError:
        return None
    return (st_.st_dev, st_.st_ino)


def per_file(cached: Callable[..., Any]) -> Callable[..., Any]:
    """``f(path, *args)`` calling the cached ``cached(path, identity, *args)``: its cache entry
    is the file's now at ``path``, never a replaced one's."""
    @functools.wraps(cached)
    def call(path: str, *args: Any) -> Any:
        return cached(path, store_identity(path), *args)
    return call


@st.cache_resource(max_entries=4, show_spinner=False)
def _reader(path: str, identity: Identity) -> StoreReader:
    return open_store(path)


def reader(path: str) -> StoreReader:
    """The shared read-only reader of the store file now at ``path`` (thread-safe: it
    serialises its queries); reopened when a new run replaced the file."""
    return _reader(path, store_identity(path))


def last_seq(path: str) -> int:
    return reader(path).last_seq()


@st.cache_resource(max_entries=16, show_spinner="Rebuilding the tree at that seq…")
def _snapshot(path: str, identity: Identity, seq: int) -> CacheSnapshot:
    return _reader(path, identity).state_at(seq)


snapshot = per_file(_snapshot)


@st.cache_resource(max_entries=8, show_spinner=False)
def _model(path: str, identity: Identity, seq: int) -> TreeModel:
    return tree_model(_snapshot(path, identity, seq))


model = per_file(_model)


@st.cache_data(max_entries=8, show_spinner=False)
def _info(path: str, identity: Identity, stamp: int) -> dict:
    return _reader(path, identity).info()


info = per_file(_info)


@st.cache_data(max_entries=4, show_spinner=False)
def _ops(path: str, identity: Identity, stamp: int) -> pd.DataFrame:
    return ops_shape.ops_table(_reader(path, identity).ops())


ops = per_file(_ops)


@st.cache_data(max_entries=4, show_spinner=False)
def _mutations(path: str, identity: Identity, stamp: int) -> pd.DataFrame:
    return _reader(path, identity).mutations()


mutations = per_file(_mutations)


@st.cache_data(max_entries=4, show_spinner=False)
def _metrics(path: str, identity: Identity, stamp: int) -> pd.DataFrame:
    return _reader(path, identity).metrics()


metrics = per_file(_metrics)


@st.cache_data(max_entries=4, show_spinner=False)
def _events(path: str, identity: Identity, stamp: int) -> pd.DataFrame:
    return _reader(path, identity).events()


events = per_file(_events)


@st.cache_data(max_entries=4, show_spinner=False)
def _violations(path: str, identity: Identity, stamp: int) -> pd.DataFrame:
    return _reader(path, identity).violations()


violations = per_file(_violations)


@st.cache_data(max_entries=4, show_spinner=False)
def _spans(path: str, identity: Identity, stamp: int) -> pd.DataFrame:
    return ops_shape.span_table(_reader(path, identity).spans())


spans = per_file(_spans)


@st.cache_data(max_entries=4, show_spinner="Replaying the journal…")
def _replayed_metrics(path: str, identity: Identity, stamp: int, points: int = 400) -> pd.DataFrame:
    """Pool ledgers after every slice of the journal, from its first keyframe to ``stamp``."""
    r = _reader(path, identity)
    first = int(r.keyframes()["seq"].min())
    return bud.replayed_pools(r.keyframe(first), r.journal(first + 1, stamp), points)


replayed_metrics = per_file(_replayed_metrics)


def run_status(path: str) -> dict:
    """How the run behind the store ended (not cached: it is a few rows, and the close record
    arrives without a new seq)."""
    return reader(path).run_status()
