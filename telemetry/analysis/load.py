"""Open a crash bundle or a telemetry store the same way: DataFrames and the tree at any seq.

``load_bundle(path)`` opens a bundle (``telemetry/capture/bundle.py``), ``load(path)`` a bundle or a
store. Both return a ``PostmortemReader``: a ``radixscope.telemetry.StoreReader``
(``ops()``, ``mutations()``, ``metrics()``, ``violations()``, ``events()``, ``info()``,
``state_at(seq)``...) plus ``nodes(seq)``, ``snapshot()``, ``failure()`` and ``ledgers()``.

Opening never executes anything from the file: it is SQLite and JSON only, and only after the
file's ``sqlite_master`` is found to hold exactly this schema (no view or trigger a file brings
is run). It ends in bounded time: SQLite's integrity check and the manifest's digests run
under a time limit (``BUNDLE_CHECK_S``), and every tree is checked for shape (one root, no
missing parent, no cycle) before it is walked. A file that is not SQLite, is truncated, fails
SQLite's own check, has another schema, whose row counts or digests (every table and every
``info`` row but the manifest) differ from the manifest, or whose tree is not a tree raises
one ``ValueError`` naming the file and what is wrong.
"""

from __future__ import annotations

import numbers
import os
import sqlite3
from pathlib import Path

import pandas as pd

from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry.analysis.storage_doctor import pending_frame, pending_from_events
from radixscope.telemetry.store.bundle_format import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    DIGESTED,
    READABLE_VERSIONS,
    row_count,
    table_digest,
)
from radixscope.telemetry.store.reader import StoreReader
from radixscope.telemetry.store.schema import check_file, time_bound
from radixscope.telemetry.store.schema import quick_check as _quick_check
from radixscope.telemetry.store.shape import check_tree

BUNDLE_CHECK_S = 10.0  # a bundle's full integrity check and digests: well under a second
_REQUIRED_INFO = ("failure", "live_snapshot", "config", "ledgers")


class PostmortemReader(StoreReader):
    """A crash bundle or a telemetry store, read-only.

    Args:
        path: the file.
        require_bundle: refuse a plain store (``load_bundle``).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: not a radixscope bundle / store, truncated or corrupt (naming the file).
    """

    def __init__(self, path: str | os.PathLike, require_bundle: bool = False) -> None:
        p = Path(path).expanduser().absolute()
        precheck(p)
        super().__init__(p)
        try:
            self._info = self.info()
            if self.is_bundle or require_bundle:
                quick_check(p)
            try:
                with time_bound(self._con, BUNDLE_CHECK_S, f"verifying {str(p)!r}"):
                    self._validate(p, require_bundle)
            except (TimeoutError, sqlite3.Error, RecursionError) as e:
                raise ValueError(f"{str(p)!r} cannot be verified as a crash bundle or telemetry "
                                 f"store ({type(e).__name__}: {e})") from None
        except Exception:
            self.close()
            raise

    def _validate(self, p: Path, require_bundle: bool) -> None:
        meta = self._info.get("bundle")
        if meta is None:
            if require_bundle:
                raise ValueError(f"{str(p)!r} is a telemetry store, not a crash bundle (it has no "
                                 "'bundle' info row); open it with telemetry.analysis.load.load")
            return
        if not isinstance(meta, dict) or meta.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"{str(p)!r}: the 'bundle' info row is not a {BUNDLE_FORMAT} "
                             f"manifest: {str(meta)[:80]!r}")
        version = meta.get("version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"crash bundle {str(p)!r} has format version {version!r}; this "
                             f"reader reads {', '.join(map(str, READABLE_VERSIONS))}")
        required = _REQUIRED_INFO + (("prefetches",) if version == BUNDLE_VERSION else ())
        missing = [k for k in required if k not in self._info]
        if missing:
            raise ValueError(f"crash bundle {str(p)!r} is incomplete: no info row(s) {missing}")
        want = meta.get("rows") if isinstance(meta.get("rows"), dict) else {}
        digests = meta.get("digests") if isinstance(meta.get("digests"), dict) else {}
        with self._read() as con:
            for table in DIGESTED:
                have = row_count(con, table) if table != "info" else None
                if table != "info" and have != want.get(table):
                    raise ValueError(f"crash bundle {str(p)!r} is truncated or damaged: table "
                                     f"{table!r} has {have} rows, its manifest says "
                                     f"{want.get(table)!r}")
                if table_digest(con, table) != digests.get(table):
                    raise ValueError(f"crash bundle {str(p)!r} is damaged: the rows of table "
                                     f"{table!r} do not match the manifest's SHA-256")
        try:
            self._live = check_tree(CacheSnapshot.from_dict(self._info["live_snapshot"]),
                                    f"crash bundle {str(p)!r}: live_snapshot")
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"crash bundle {str(p)!r}: live_snapshot: {e}") from None

    # ---- what kind of file ---------------------------------------------------------------------
    @property
    def is_bundle(self) -> bool:
        return "bundle" in self._info

    def manifest(self) -> dict:
        """The bundle's ``bundle`` info row ({} for a store)."""
        return dict(self._info.get("bundle") or {})

    def failure(self) -> dict | None:
        """The failure (op, exception, message, traceback, frames, node, seq, oom...), or None
        for a store."""
        f = self._info.get("failure")
        return dict(f) if f else None

    def config(self) -> dict:
        """The cache's config summary."""
        if "config" in self._info:
            return dict(self._info["config"])
        return dict((self._info.get("cache") or {}).get("config") or {})

    def prefetches(self) -> pd.DataFrame:
        """The L3 prefetches pending when the bundle was written (``storage_doctor.
        PENDING_COLUMNS``; none in a version-3 bundle); for a store, those its events show
        started and not ended.

        Raises:
            ValueError: the bundle's ``prefetches`` row is not a list of prefetch states.
        """
        if not self.is_bundle:
            return pending_from_events(self.events())
        rows = self._info.get("prefetches", [])
        if not isinstance(rows, list):
            raise ValueError(f"crash bundle {str(self.path)!r}: 'prefetches' is not a list")
        errors = [r["error"] for r in rows if isinstance(r, dict) and "error" in r]
        if errors:
            raise ValueError(f"crash bundle {str(self.path)!r}: the cache's pending prefetches "
                             f"could not be read when it was written: {errors[0]}")
        return pending_frame(rows)

    # ---- states --------------------------------------------------------------------------------
    def snapshot(self) -> CacheSnapshot:
        """Bundle: the live snapshot taken at the failure. Store: the state at ``last_seq()``."""
        if self.is_bundle:
            return self._live
        return self.state_at(self.last_seq())

    def state_at(self, seq: int) -> CacheSnapshot:
        """The tree right after mutation ``seq`` (nearest keyframe + replay).

        Raises:
            ValueError: ``seq`` is outside what this file can rebuild (the message says which
                seqs it can).
        """
        if isinstance(seq, bool) or not isinstance(seq, numbers.Integral):
            raise TypeError(f"seq must be an int, got {seq!r}")
        try:
            return super().state_at(int(seq))
        except ValueError as e:
            if not self.is_bundle:
                raise
            w = self.manifest().get("window") or {}
            hint = (f"this bundle rebuilds seqs {w.get('keyframe_seq')}..{self.last_seq()}")
            if not w.get("replayable"):
                hint += (" only: the flight recorder had no keyframe for its window (its ring "
                         "had wrapped); use radixscope.telemetry.capture.flight.KeyframedFlightRecorder")
            raise ValueError(f"{e}; {hint}") from None

    def nodes(self, seq: int | None = None) -> pd.DataFrame:
        """One row per node at ``seq`` (default: the failure for a bundle, the last seq for a
        store); see ``nodes_frame``."""
        return nodes_frame(self.snapshot() if seq is None else self.state_at(seq))

    def ledgers(self) -> pd.DataFrame:
        """Bundle: the live pool and ledger figures at the failure (with ``request_held``).
        Store: the last metric sample per pool."""
        if self.is_bundle:
            return pd.DataFrame(self._info["ledgers"])
        m = self.metrics()
        if m.empty:
            return m
        return m.groupby(["component", "tier"], sort=False).tail(1).reset_index(drop=True)

    def check_violations(self) -> pd.DataFrame:
        """What ``cache.check()`` reported when the bundle was written (empty for a store)."""
        rows = (self._info.get("check") or {}).get("violations") or []
        df = pd.DataFrame(rows, columns=["name", "node", "detail"])
        df["node"] = df["node"].astype("Int64")
        return df


def precheck(p: Path) -> None:
    """File-level checks before SQLite opens it: present, a file, SQLite, not truncated
    (``telemetry.store.schema.check_file``).

    Raises:
        FileNotFoundError: nothing at ``p``.
        ValueError: a directory, not SQLite, or shorter than its header says.
    """
    check_file(p, "crash bundle or telemetry store")


def quick_check(p: Path) -> None:
    """SQLite's own page-level check of the whole file (bundles: small), bounded in time.

    Raises:
        ValueError: SQLite finds damage, or the check takes longer than ``BUNDLE_CHECK_S``.
    """
    try:
        con = sqlite3.connect(f"{p.as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise ValueError(f"{str(p)!r} is corrupt: SQLite says {e}") from None
    try:
        if not _quick_check(con, p, BUNDLE_CHECK_S):
            raise ValueError(f"{str(p)!r}: SQLite's integrity check did not finish within "
                             f"{BUNDLE_CHECK_S:g} s; not read as a crash bundle")
    finally:
        con.close()


def nodes_frame(snap: CacheSnapshot) -> pd.DataFrame:
    """One row per node (index ``node_id``): ``parent_id`` (-1 for the root), ``depth``,
    ``prefix_start`` / ``prefix_end`` (token positions the node covers), ``key_len``,
    ``tokens`` (tuple), ``extra_key``, ``last_access``, ``hits``, and per component ``c``:
    ``dev_<c>`` / ``host_<c>`` (length, -1 = no value), ``lock_<c>``, ``href_<c>``,
    ``state_<c>`` (device / host / device+host / tombstone).

    Raises:
        ValueError: the nodes do not form one tree (a cycle, a missing parent...).
    """
    check_tree(snap, f"snapshot at seq {snap.seq}")
    by_id = {n.node_id: n for n in snap.nodes}
    depth: dict[int, int] = {}
    start: dict[int, int] = {}
    for n in snap.nodes:
        _place(n.node_id, by_id, depth, start)
    rows = []
    for n in snap.nodes:
        row = {"node_id": n.node_id, "parent_id": -1 if n.parent_id is None else n.parent_id,
               "depth": depth[n.node_id], "prefix_start": start[n.node_id],
               "prefix_end": start[n.node_id] + n.key_len, "key_len": n.key_len,
               "tokens": n.tokens, "extra_key": n.extra_key, "last_access": n.last_access,
               "hits": n.hit_count}
        for c, s in zip(snap.components, n.components, strict=True):
            row[f"dev_{c}"] = -1 if s.device_len is None else s.device_len
            row[f"host_{c}"] = -1 if s.host_len is None else s.host_len
            row[f"lock_{c}"] = s.lock_ref
            row[f"href_{c}"] = s.host_ref
            row[f"state_{c}"] = "root" if n.parent_id is None else s.state
        rows.append(row)
    return pd.DataFrame(rows).set_index("node_id")


def _place(nid: int, by_id: dict, depth: dict[int, int], start: dict[int, int]) -> None:
    chain = []
    cur = nid
    while cur not in depth:
        n = by_id[cur]
        if n.parent_id is None:
            depth[cur], start[cur] = 0, 0
            break
        chain.append(cur)
        cur = n.parent_id
    for c in reversed(chain):
        par = by_id[c].parent_id
        depth[c] = depth[par] + 1
        start[c] = start[par] + by_id[par].key_len


def load_bundle(path: str | os.PathLike) -> PostmortemReader:
    """Open a crash bundle (a store is refused: use ``load``)."""
    return PostmortemReader(path, require_bundle=True)


def load(path: str | os.PathLike) -> PostmortemReader:
    """Open a crash bundle or a telemetry store, whichever ``path`` is."""
    return PostmortemReader(path)


__all__ = ["PostmortemReader", "load", "load_bundle", "nodes_frame", "precheck"]
