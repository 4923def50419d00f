"""Appends to the embedded store through its single writer connection.

The sink calls the ``write_*`` methods while handling a batch of messages and then ``commit``,
so one batch (its ops, mutations, spans and any keyframe) becomes visible to readers at once.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable

from radixscope.cache.events import NODE_CREATE
from radixscope.telemetry.record.encode import CompactOp, SpanRow
from radixscope.telemetry.store.jsontext import dumps, journal_chunk
from radixscope.telemetry.store.keyframes import pack_tokens
from radixscope.telemetry.store.schema import connect_writer

_OPS_SQL = "INSERT INTO ops VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
_JOURNAL_SQL = "INSERT INTO journal VALUES (?,?,?)"
_TOKENS_SQL = "INSERT OR REPLACE INTO node_tokens VALUES (?, ?)"
_SPAN_SQL = "INSERT INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
_METRIC_SQL = "INSERT INTO metrics VALUES (?,?,?,?,?,?,?,?,?)"


class StoreWriter:
    """The store's writer.

    Args:
        path: an existing store (made by ``telemetry.store.schema.create_store``).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self.con: sqlite3.Connection | None = connect_writer(path)
        self._in_tx = False
        self._resources: dict[str, int] = {
            attrs: rid for rid, attrs in self.con.execute("SELECT id, attributes FROM resources")}

    def _tx(self) -> sqlite3.Connection:
        con = self.con
        if con is None:
            raise RuntimeError(f"store writer for {self.path!r} is closed")
        if not self._in_tx:
            con.execute("BEGIN")
            self._in_tx = True
        return con

    def commit(self) -> None:
        """Make everything written since the last commit visible to readers."""
        if self._in_tx and self.con is not None:
            self._in_tx = False
            self.con.execute("COMMIT")

    def close(self) -> None:
        if self.con is None:
            return
        try:
            self.commit()
        finally:
            self.con.close()
            self.con = None

    # ---- rows ------------------------------------------------------------------------------
    def set_info(self, key: str, value: object) -> None:
        self._tx().execute("INSERT OR REPLACE INTO info VALUES (?, ?)", (key, dumps(value)))

    def write_ops(self, ops: Iterable[CompactOp],
                  span_ids: Iterable[tuple[str | None, str | None, str | None]]) -> None:
        """One row per op, with the (trace, span, parent span) hex ids of the span built for it."""
        rows = []
        for op, (tid, sid, pid) in zip(ops, span_ids, strict=True):
            rows.append((op.op_id, op.op, op.start_ns, op.end_ns, op.req_id, op.seq_first,
                         op.seq_last, tid, sid, pid, dumps(op.attrs), op.error))
        if rows:
            self._tx().executemany(_OPS_SQL, rows)

    def write_mutations(self, mutations: list[tuple]) -> None:
        """One ``journal`` chunk: mutations in increasing seq order, after the last chunk's,
        a created node's tokens inline (the KV-event watcher's stores, which write no
        ``node_tokens`` rows)."""
        if mutations:
            self._tx().execute(_JOURNAL_SQL, journal_chunk(mutations))

    def write_journal(self, mutations: list[tuple]) -> None:
        """As ``write_mutations``, each token stored once (schema 5): a created node's tokens
        go to ``node_tokens`` and its ``node.create`` names their count, ``[parent,
        extra_key, n_tokens]``; the readers (``rows.journal_rows``) put them back. Node ids
        must not repeat within the store (a cache's never do). Before, the journal's JSON held
        every token a second time: two thirds of its bytes (bench/RESULTS.md, #17,
        twenty-eighth round)."""
        if not mutations:
            return
        out = mutations
        tokens = []
        for i, m in enumerate(mutations):
            if m[2] == NODE_CREATE:
                if out is mutations:
                    out = list(mutations)
                parent, extra_key, toks = m[6]
                tokens.append((m[3], pack_tokens(toks)))
                out[i] = (*m[:6], (parent, extra_key, len(toks)))
        tx = self._tx()
        if tokens:
            tx.executemany(_TOKENS_SQL, tokens)
        tx.execute(_JOURNAL_SQL, journal_chunk(out))

    def write_spans(self, rows: Iterable[SpanRow]) -> None:
        out = []
        for r in rows:
            out.append((r.trace_id, r.span_id, r.parent_span_id, r.name, r.kind, r.start_ns,
                        r.end_ns, r.status_code, r.status_message, r.attributes, r.events,
                        r.links, self._resource_id(r.resource), r.scope, r.op_id))
        if out:
            self._tx().executemany(_SPAN_SQL, out)

    def _resource_id(self, attrs_json: str) -> int:
        rid = self._resources.get(attrs_json)
        if rid is None:
            cur = self._tx().execute("INSERT INTO resources (attributes) VALUES (?)",
                                     (attrs_json,))
            rid = int(cur.lastrowid)
            self._resources[attrs_json] = rid
        return rid

    def write_keyframe(self, seq: int, snapshot: dict | bytes, ts_ns: int | None = None) -> None:
        """A keyframe: a snapshot dict (stored as JSON text, tokens inline) or the bytes of
        ``telemetry.store.keyframes.encode`` (token references, compressed)."""
        data = snapshot if isinstance(snapshot, bytes) else json.dumps(snapshot,
                                                                       separators=(",", ":"))
        self._tx().execute("INSERT OR REPLACE INTO keyframes VALUES (?, ?, ?)",
                           (seq, ts_ns or time.time_ns(), data))

    def write_node_tokens(self, rows: Iterable[tuple[int, object]]) -> None:
        """Each created node's tokens, once (what keyframes' token references point into)."""
        out = [(node, pack_tokens(tokens)) for node, tokens in rows]
        if out:
            self._tx().executemany(_TOKENS_SQL, out)

    def write_metrics(self, seq: int, ts_ns: int,
                      pools: Iterable[tuple[str, str, int, int, int, int, int]]) -> None:
        rows = [(seq, ts_ns, *p) for p in pools]
        if rows:
            self._tx().executemany(_METRIC_SQL, rows)

    def write_event(self, ts_ns: int, seq: int | None, kind: str, attrs: dict) -> None:
        self._tx().execute("INSERT INTO events (ts_ns, seq, kind, attrs) VALUES (?,?,?,?)",
                           (ts_ns, seq, kind, dumps(attrs)))

    def write_violation(self, ts_ns: int, seq: int | None, kind: str, message: str,
                        details: dict) -> None:
        self._tx().execute(
            "INSERT INTO violations (ts_ns, seq, kind, message, details) VALUES (?,?,?,?,?)",
            (ts_ns, seq, kind, message, dumps(details)))

