"""Read-only access to a store: pandas DataFrames and the tree at any seq.

``open_store(path)`` opens the file read-only (``mode=ro``); it may be read while a writer is
appending (WAL gives each query, and each ``state_at``, a consistent snapshot). Multi-query
reads run in one read transaction.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd

from radixscope.cache import events as ev
from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry import names as n
from radixscope.telemetry.store import keyframes
from radixscope.telemetry.store.readguard import Malformed, file_errors, int_arg, str_arg
from radixscope.telemetry.store.rows import (
    decode,
    decode_mutation,
    enqueued_by,
    journal_rows,
    journal_top,
    json_type,
    op_attrs,
    shaped,
)
from radixscope.telemetry.store.runstate import run_status
from radixscope.telemetry.store.schema import connect_reader
from radixscope.telemetry.store.shape import check_tree, rebuild
from radixscope.telemetry.store.span_attrs import op_attributes

SPAN_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
                "status_code", "status_message", "attributes", "events", "links", "resource",
                "scope", "op_id")
MUTATION_COLUMNS = ("seq", "op_id", "kind", "node", "comp", "tier", "value")


class StoreReader:
    """A read-only view of one telemetry store.

    Args:
        path: the store file.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: ``path`` is not a radixscope telemetry store (or is corrupt). Damage found
            later, by a read, raises ``ValueError`` naming the file too.
    """

    def __init__(self, path: str | os.PathLike, integrity_budget_s: float | None = 1.0) -> None:
        self.path = str(path)
        self._con = connect_reader(path, integrity_budget_s=integrity_budget_s)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One consistent read transaction (a WAL snapshot)."""
        with self._lock:
            con = self._con
            con.execute("BEGIN")
            try:
                yield con
            finally:
                con.execute("COMMIT")

    def _frame(self, table: str, sql: str, params: tuple = ()) -> pd.DataFrame:
        """The rows of a query on ``table``, JSON decoded and shapes checked (``rows.shaped``)."""
        with self._read() as con:
            cur = con.execute(sql, params)
            cols = [d[0] for d in cur.description]
            records = cur.fetchall()
        return shaped(table, pd.DataFrame.from_records(records, columns=cols))

    # ---- tables ----------------------------------------------------------------------------
    @file_errors
    def info(self) -> dict:
        """``info`` as a dict of decoded JSON values (``cache``, ``settings``, ``stats``...)."""
        with self._read() as con:
            rows = con.execute("SELECT key, value FROM info").fetchall()
        try:
            return {k: json.loads(v) for k, v in rows}
        except (TypeError, ValueError) as e:  # ValueError: an integer past json's digit limit
            raise Malformed(f"an info value is not JSON text: {type(e).__name__}: {e}"
                            ) from None

    @file_errors
    def ops(self, op: str | None = None, since_op_id: int | None = None) -> pd.DataFrame:
        """One row per cache op (ordered by op id), ``attrs`` decoded.

        Args:
            op: only this op name.
            since_op_id: only ops with a larger id.
        """
        str_arg("op", op)
        int_arg("since_op_id", since_op_id)
        where, params = _where(("op = ?", op), ("op_id > ?", since_op_id))
        return self._frame("ops", f"SELECT * FROM ops{where} ORDER BY op_id", params)

    @file_errors
    def mutations(self, start_seq: int | None = None, end_seq: int | None = None) -> pd.DataFrame:
        """The journal, ordered by seq, ``value`` decoded; bounds are inclusive."""
        int_arg("start_seq", start_seq)
        int_arg("end_seq", end_seq)
        with self._read() as con:
            rows = journal_rows(con, start_seq, end_seq)
        df = pd.DataFrame.from_records(rows, columns=list(MUTATION_COLUMNS))
        try:
            df["node"] = df["node"].astype("Int64")
        except (TypeError, ValueError, OverflowError):
            bad = next((m for m in rows if m[3] is not None and not (
                type(m[3]) is int and -2**63 <= m[3] < 2**63)), rows[0])
            raise Malformed(f"journal mutation at seq {bad[0]}: node is {bad[3]!r}, expected "
                            "a node id (a 64-bit integer) or null") from None
        return df

    @file_errors
    def spans(self, trace_id: str | None = None, name: str | None = None,
              include_cache: bool = True) -> pd.DataFrame:
        """Every span, ordered by start time: the cache's op spans (rendered from the ``ops``
        rows, which carry their ids) and the host process's spans (``spans`` table).

        Args:
            trace_id: only spans of this trace (hex).
            name: only spans with this name (e.g. ``kv_cache.match``).
            include_cache: include the cache's op spans.

        Returns:
            Columns ``trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns,
            status_code, status_message, attributes, events, links, resource, scope, op_id``.
        """
        str_arg("trace_id", trace_id)
        str_arg("name", name)
        where, params = _where(("s.trace_id = ?", trace_id), ("s.name = ?", name))
        host = self._frame("spans", "SELECT s.*, r.attributes AS resource FROM spans s LEFT JOIN "
                           f"resources r ON r.id = s.resource_id{where} ORDER BY s.start_ns, "
                           "s.rowid", params)
        host["resource"] = [decode(v, dict, "resources", "attributes", f"id={rid!r}") if v
                            else {} for v, rid in zip(host["resource"], host["resource_id"],
                                                      strict=True)]
        host = host.drop(columns=["resource_id"])
        if include_cache and (name is None or name.startswith(n.SPAN_PREFIX)):
            cache = self._cache_spans(trace_id, name)
            if not cache.empty:
                host = cache if host.empty else pd.concat([host, cache], ignore_index=True)
        host = host.sort_values(["start_ns"], kind="stable", ignore_index=True)
        host["op_id"] = host["op_id"].astype("Int64")
        return host

    def _cache_spans(self, trace_id: str | None, name: str | None) -> pd.DataFrame:
        ops_of_name = [op for op, sn in n.SPAN_NAMES.items() if sn == name] if name else []
        if name and not ops_of_name:
            return pd.DataFrame()
        conds = [("trace_id = ?", trace_id)]
        where, params = _where(*conds)
        where = (where + " AND" if where else " WHERE") + " span_id IS NOT NULL"
        if ops_of_name:
            where += f" AND op IN ({','.join('?' * len(ops_of_name))})"
            params = (*params, *ops_of_name)
        with self._read() as con:
            rows = con.execute(f"SELECT * FROM ops{where} ORDER BY op_id", params).fetchall()
            attrs_of = [op_attrs(r) for r in rows]
            enq_of = [enqueued_by(a, r[0]) if r[1] == ev.OP_TRANSFER else None
                      for r, a in zip(rows, attrs_of, strict=True)]
            span_of: dict[int, tuple[str, str]] = {}
            enq = set(enq_of)
            enq.discard(None)
            for chunk in _chunks(sorted(enq), 500):
                q = (f"SELECT op_id, trace_id, span_id FROM ops WHERE op_id IN "
                     f"({','.join('?' * len(chunk))}) AND span_id IS NOT NULL")
                span_of.update({o: (t, s) for o, t, s in con.execute(q, chunk)})
            res = con.execute("SELECT value FROM info WHERE key = 'resource'").fetchone()
        resource = decode(res[0], dict, "info", "value", "key='resource'") if res else {}
        out = []
        for row, attrs, e in zip(rows, attrs_of, enq_of, strict=True):
            op_id, op, start, end, req, sf, sl, tid, sid, pid, _attrs_json, error = row
            links = []
            if e in span_of:
                links.append([span_of[e][0], span_of[e][1], {n.LINK_ATTR_OP_ID: e}])
            out.append((tid, sid, pid, n.span_name(op), "INTERNAL", start, max(start, end),
                        "ERROR" if error else "UNSET", error,
                        op_attributes(op_id, op, sf, sl, req, attrs, error), [], links,
                        resource, n.INSTRUMENTATION_SCOPE, op_id))
        return pd.DataFrame.from_records(out, columns=list(SPAN_COLUMNS))

    @file_errors
    def keyframes(self) -> pd.DataFrame:
        """Keyframe seqs and times (without the snapshot JSON; see ``keyframe``)."""
        return self._frame("keyframes", "SELECT seq, ts_ns, length(snapshot) AS bytes "
                           "FROM keyframes ORDER BY seq")

    @file_errors
    def keyframe(self, seq: int) -> CacheSnapshot:
        """The keyframe snapshot stored at exactly ``seq``."""
        int_arg("seq", seq, optional=False)
        with self._read() as con:
            row = con.execute("SELECT snapshot FROM keyframes WHERE seq = ?", (seq,)).fetchone()
            if row is None:
                raise KeyError(f"no keyframe at seq {seq} in {self.path!r}")
            snap = self._snapshot(con, row[0], seq)
        return check_tree(snap, f"{self.path!r} keyframe at seq {seq}")

    def _snapshot(self, con: sqlite3.Connection, raw: object, seq: object) -> CacheSnapshot:
        """A stored keyframe as a ``CacheSnapshot`` (``ValueError`` naming the file)."""
        try:
            return keyframes.load(con, raw)  # type: ignore[arg-type]
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"{self.path!r}: the keyframe at seq {seq} is not a valid cache "
                             f"snapshot ({type(e).__name__}: {e})") from None

    @file_errors
    def metrics(self) -> pd.DataFrame:
        """Pool samples per component x tier over time, with ``held`` derived."""
        df = self._frame("metrics", "SELECT * FROM metrics ORDER BY seq, ts_ns, rowid")
        if not df.empty:
            df["held"] = df["capacity"] - df["available"] - df["evictable"] - df["protected"]
        return df

    @file_errors
    def violations(self) -> pd.DataFrame:
        return self._frame("violations", "SELECT * FROM violations ORDER BY id")

    @file_errors
    def events(self, kind: str | None = None) -> pd.DataFrame:
        str_arg("kind", kind)
        where, params = _where(("kind = ?", kind))
        return self._frame("events", f"SELECT * FROM events{where} ORDER BY id", params)

    @file_errors
    def stats(self) -> dict:
        """Telemetry health as of the writer's last flush (dropped / failures / notes)."""
        stats = self.info().get("stats", {})
        if not isinstance(stats, dict):
            raise Malformed(f"info row key='stats' is {json_type(stats)}, expected a JSON object")
        return stats

    @file_errors
    def run_status(self) -> dict:
        """Whether the run that wrote this store finished cleanly (``telemetry.store.runstate``):
        ``{"state", "clean", "last_seq", "last_ns", "message"}``."""
        return run_status(self.info(), *self._tops())

    def _tops(self) -> tuple[int | None, int | None, int | None]:
        with self._read() as con:
            top = journal_top(con)
            kf = con.execute("SELECT max(seq) FROM keyframes").fetchone()[0]
            op = con.execute("SELECT end_ns FROM ops ORDER BY op_id DESC LIMIT 1").fetchone()
        return top, kf, (op[0] if op else None)

    # ---- the journal -------------------------------------------------------------------------
    @file_errors
    def last_seq(self) -> int:
        """Highest seq the store can rebuild (last mutation, or the first keyframe's seq)."""
        with self._read() as con:
            m = journal_top(con)
            k = con.execute("SELECT max(seq) FROM keyframes").fetchone()[0]
        vals = [v for v in (m, k) if v is not None]
        if not vals:
            raise ValueError(f"telemetry store {self.path!r} holds no journal yet "
                             "(no cache has attached)")
        return max(vals)

    @file_errors
    def journal(self, start_seq: int | None = None, end_seq: int | None = None) -> list[tuple]:
        """Mutation tuples ``(seq, op_id, kind, node, comp, tier, value)`` ready for replay."""
        int_arg("start_seq", start_seq)
        int_arg("end_seq", end_seq)
        with self._read() as con:
            rows = journal_rows(con, start_seq, end_seq)
        return self._decoded(rows)

    def _decoded(self, rows: list[list]) -> list[tuple]:
        try:
            return [decode_mutation(r) for r in rows]
        except (ValueError, TypeError, IndexError) as e:
            raise ValueError(f"{self.path!r}: a journal entry is malformed ({type(e).__name__}: "
                             f"{e})") from None

    @file_errors
    def blocks(self, seq: int | None = None) -> pd.DataFrame:
        """KV blocks resident at ``seq`` (default: the end): ``medium, group, hash,
        parent_hash, token_ids, stored_seq`` (see ``telemetry/kvevents/frame.py``)."""
        int_arg("seq", seq)
        from radixscope.telemetry.kvevents.frame import blocks_frame
        try:
            return blocks_frame(self, seq)
        except (AttributeError, TypeError, KeyError, IndexError, OverflowError) as e:
            raise Malformed(f"kv_blocks / kv_events info: {type(e).__name__}: {e}") from None
        except ValueError as e:
            if str(self.path) in str(e):  # already names the file (state_at and the like)
                raise
            raise Malformed(f"kv_blocks / kv_events info: {e}") from None

    @file_errors
    def state_at(self, seq: int) -> CacheSnapshot:
        """The cache as it was right after mutation ``seq``: the nearest keyframe at or before
        ``seq`` plus a replay of the mutations after it.

        Args:
            seq: a seq between the first keyframe's and ``last_seq()``.

        Returns:
            The rebuilt snapshot (equal to ``cache.snapshot()`` taken at that seq).

        Raises:
            TypeError: ``seq`` is not an int.
            ValueError: ``seq`` is out of range or the journal has a gap before it; the file's
                keyframe or journal does not form a tree.
        """
        int_arg("seq", seq, optional=False)
        seq = int(seq)
        with self._read() as con:
            kf = con.execute("SELECT seq, snapshot FROM keyframes WHERE seq <= ? "
                             "ORDER BY seq DESC LIMIT 1", (seq,)).fetchone()
            if kf is None:
                first = con.execute("SELECT min(seq) FROM keyframes").fetchone()[0]
                raise ValueError(f"seq {seq} is before the first keyframe ({first}) of "
                                 f"{self.path!r}")
            rows = journal_rows(con, kf[0] + 1, seq)
            top = journal_top(con)
            start = self._snapshot(con, kf[1], kf[0])
        if seq > max(kf[0], top if top is not None else kf[0]):
            raise ValueError(f"seq {seq} is past the last seq ({max(kf[0], top or kf[0])}) "
                             f"of {self.path!r}")
        if len(rows) != seq - kf[0]:
            have = {r[0] for r in rows}
            missing = next(s for s in range(kf[0] + 1, seq + 1) if s not in have)
            raise ValueError(f"the journal of {self.path!r} has a gap at seq {missing} "
                             "(records were dropped); the state after it cannot be rebuilt")
        return rebuild(start, self._decoded(rows), f"{self.path!r} at seq {seq}")


def open_store(path: str | os.PathLike) -> StoreReader:
    """Open a telemetry store read-only.

    Args:
        path: the store file.

    Returns:
        A ``StoreReader``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a radixscope telemetry store (wrong file, corrupt, other version).
    """
    return StoreReader(path)


def _where(*conds: tuple[str, object]) -> tuple[str, tuple]:
    parts = [(c, v) for c, v in conds if v is not None]
    if not parts:
        return "", ()
    return " WHERE " + " AND ".join(c for c, _ in parts), tuple(v for _, v in parts)


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
