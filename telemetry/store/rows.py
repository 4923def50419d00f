"""The shape of a store's rows, checked as the readers decode them.

A store file is untrusted, and SQLite keeps whatever a file holds whatever a column's declared
type: text in an INTEGER column, a JSON list where the writer wrote an object. The readers
decode rows through here, so a wrong shape is one ``Malformed`` naming the table, the row and
the shape expected (``readguard.file_errors`` adds the file), never an ``AttributeError`` deep
in a reader, the Perfetto export or a page. The cost stays flat: one type test per decoded JSON
value and one dtype test per integer column (a scan of that column only when the test fails).
The journal's chunks are decoded here too (``journal_rows``); what a mutation's value holds is
checked by the replay that uses it (``shape.rebuild``).
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
from collections.abc import Callable

import numpy as np
import pandas as pd

from radixscope.cache import events as ev
from radixscope.telemetry.store.keyframes import unpack_tokens
from radixscope.telemetry.store.readguard import Malformed
from radixscope.telemetry.store.schema import SCHEMA

JSON_SHAPES: dict[str, dict[str, type]] = {
    "ops": {"attrs": dict},
    "spans": {"attributes": dict, "events": list, "links": list},
    "violations": {"details": dict},
    "events": {"attrs": dict},
}
"""The JSON columns the readers decode, and the JSON type the writer puts in each."""
NULLABLE_INT64 = {"spans": ("op_id",), "events": ("seq",), "violations": ("seq",)}
"""Nullable integer columns a frame gives as pandas ``Int64``."""
ROW_KEYS = {"ops": "op_id", "spans": "span_id", "violations": "id", "events": "id",
            "metrics": "seq", "keyframes": "seq"}
"""The column that names a row in a message."""
_JSON_NAMES = {dict: "a JSON object", list: "a JSON array", str: "a JSON string",
               int: "a JSON integer", float: "a JSON number", bool: "a JSON boolean",
               type(None): "JSON null"}


@functools.cache
def int_columns(table: str) -> tuple[tuple[str, bool], ...]:
    """``(column, nullable)`` for each INTEGER column of ``table`` in the schema."""
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(SCHEMA)
        info = con.execute(f"PRAGMA table_info({table})").fetchall()
    finally:
        con.close()
    return tuple((name, not notnull) for _cid, name, decl, notnull, _dflt, _pk in info
                 if decl == "INTEGER")


def shaped(table: str, df: pd.DataFrame) -> pd.DataFrame:
    """``df``, rows of ``table`` as SQLite gave them, with its JSON columns decoded and its
    integer columns checked (the nullable ones of ``NULLABLE_INT64`` as ``Int64``).

    Raises:
        Malformed: a JSON column that is not JSON text or not of the writer's JSON type, or an
            INTEGER column holding something else; names the table, row and shape expected.
    """
    for col, kind in JSON_SHAPES.get(table, {}).items():
        if col in df.columns:
            df[col] = decode_column(table, col, df[col].tolist(), kind,
                                    functools.partial(_keys, table, df))
    for col, nullable in int_columns(table):
        if col in df.columns:
            df[col] = _ints(table, df, col, nullable)
    return df


def decode_column(table: str, col: str, raw: list, kind: type,
                  keys: Callable[[], list]) -> list:
    """Each JSON text in ``raw`` decoded; ``Malformed`` naming ``keys()[i]`` (built only
    then: the rows' names cost a format each) unless every one is JSON text of type ``kind``."""
    try:
        vals = [json.loads(v) for v in raw]
    except (ValueError, TypeError, RecursionError):
        for v, key in zip(raw, keys(), strict=True):
            decode(v, kind, table, col, key)  # raises for the first bad row
        raise
    bad = [i for i, v in enumerate(vals) if type(v) is not kind]
    if bad:
        i = bad[0]
        raise Malformed(f"{table} row {keys()[i]}: {col} is {json_type(vals[i])}, expected "
                        f"{_JSON_NAMES[kind]} ({len(bad)} of {len(vals)} rows are not)")
    return vals


def decode(raw: object, kind: type, table: str, col: str, key: object) -> object:
    """One JSON text of type ``kind`` decoded, else ``Malformed`` naming the row."""
    try:
        v = json.loads(raw)  # type: ignore[arg-type]
    except (ValueError, TypeError, RecursionError) as e:
        raise Malformed(f"{table} row {key}: {col} is not JSON text ({type(e).__name__}: "
                        f"{e})") from None
    if type(v) is not kind:
        raise Malformed(f"{table} row {key}: {col} is {json_type(v)}, expected "
                        f"{_JSON_NAMES[kind]}")
    return v


def op_attrs(row: tuple) -> dict:
    """An ``ops`` row's decoded ``attrs``, once the fields a span is built from are checked.

    Raises:
        Malformed: ``attrs`` is not a JSON object, a time or seq not an integer, or ``error``
            neither text nor null.
    """
    op_id, _op, start, end, _req, sf, sl, _tid, _sid, _pid, attrs_json, error = row
    attrs = decode(attrs_json, dict, "ops", "attrs", f"op_id={op_id!r}")
    if not (type(start) is int and type(end) is int and type(sf) is int and type(sl) is int):
        raise Malformed(f"ops row op_id={op_id!r}: start_ns, end_ns, seq_first, seq_last are "
                        f"{start!r}, {end!r}, {sf!r}, {sl!r}, expected integers")
    if error is not None and type(error) is not str:
        raise Malformed(f"ops row op_id={op_id!r}: error is {error!r}, expected text or null")
    return attrs


def enqueued_by(attrs: dict, op_id: object) -> int | None:
    """The op that enqueued a transfer (its ``attrs``), or None; ``Malformed`` if not an id."""
    e = attrs.get(ev.A_ENQUEUED_BY)
    if e is None or type(e) is int:
        return e
    raise Malformed(f"ops row op_id={op_id!r}: attrs.{ev.A_ENQUEUED_BY} is {e!r}, expected "
                    "an op id (an integer) or null")


def json_type(v: object) -> str:
    """What a decoded JSON value is, for a message (``"a JSON array"``)."""
    return _JSON_NAMES.get(type(v), f"a {type(v).__name__}")


def _keys(table: str, df: pd.DataFrame) -> list:
    col = ROW_KEYS.get(table)
    if col is None or col not in df.columns:
        return [f"#{i}" for i in range(len(df))]
    return [f"{col}={v!r}" for v in df[col].tolist()]


def _ints(table: str, df: pd.DataFrame, col: str, nullable: bool) -> pd.Series:
    s = df[col]
    as_int64 = col in NULLABLE_INT64.get(table, ())
    if s.dtype.kind in "iu":
        return s.astype("Int64") if as_int64 else s
    if s.dtype.kind == "f":  # an integer column with NULLs, as pandas reads it: one pass
        whole = np.isfinite(s) & (s == np.floor(s)) & (s.abs() < 2.0**63)
        if bool((whole | s.isna()).all() if nullable else whole.all()):
            return s.astype("Int64") if as_int64 else s
    vals = s.tolist()  # NULLs (and ints beside them) come as None / NaN and floats
    bad = [i for i, v in enumerate(vals) if not _int_like(v, nullable)]
    if not bad and as_int64:
        try:
            return s.astype("Int64")
        except (TypeError, ValueError, OverflowError):
            bad = [i for i, v in enumerate(vals) if not -2**63 <= _num(v) < 2**63]
    if bad:
        i = bad[0]
        raise Malformed(f"{table} row {_keys(table, df)[i]}: {col} is {vals[i]!r}, expected an "
                        f"integer{' or null' if nullable else ''} ({len(bad)} of {len(vals)} "
                        "rows are not)")
    return s


def _int_like(v: object, nullable: bool) -> bool:
    if type(v) is int:
        return True
    if type(v) is float:  # pandas' cast of an integer column with NULLs
        return v.is_integer() or (nullable and math.isnan(v))
    return nullable and v is None


def _num(v: object) -> float:
    return 0 if v is None or (type(v) is float and math.isnan(v)) else v  # type: ignore[return-value]


# ---- the journal -------------------------------------------------------------------------
def journal_top(con: sqlite3.Connection) -> int | None:
    """The last stored seq (chunks are in seq order: the last chunk's end), or None."""
    row = con.execute("SELECT seq_first, seq_last FROM journal ORDER BY seq_first DESC "
                      "LIMIT 1").fetchone()
    if row is None:
        return None
    if type(row[1]) is not int:
        raise Malformed(f"journal row seq_first={row[0]}: seq_last is {row[1]!r}, expected an "
                        "integer")
    return row[1]


def journal_rows(con: sqlite3.Connection, lo: int | None, hi: int | None) -> list[list]:
    """Decoded mutations ``[seq, op_id, kind, node, comp, tier, value]`` with ``lo <= seq <=
    hi`` (None: unbounded), in seq order: the ``journal`` chunks that can hold them (found
    through the ``seq_first`` key), decoded and cut to the range."""
    first = -1 if lo is None else con.execute(
        "SELECT coalesce(max(seq_first), -1) FROM journal WHERE seq_first <= ?", (lo,)
    ).fetchone()[0]
    sql = "SELECT seq_first, data FROM journal WHERE seq_first >= ?"
    params: tuple = (first,)
    if hi is not None:
        sql += " AND seq_first <= ?"
        params = (first, hi)
    out: list[list] = []
    for seq_first, data in con.execute(sql + " ORDER BY seq_first", params):
        try:
            chunk = json.loads(data)
            if not isinstance(chunk, list) or not all(
                    isinstance(m, list) and len(m) == 7 and isinstance(m[0], int) for m in chunk):
                raise TypeError("not a list of [seq, op_id, kind, node, comp, tier, value]")
            if chunk and ((lo is not None and chunk[0][0] < lo)
                          or (hi is not None and chunk[-1][0] > hi)):
                chunk = [m for m in chunk
                         if (lo is None or m[0] >= lo) and (hi is None or m[0] <= hi)]
        except (TypeError, ValueError) as e:  # ValueError: an integer past json's digit limit
            raise Malformed(f"a journal chunk is malformed (row seq_first={seq_first}): "
                            f"{type(e).__name__}: {e}") from None
        out.extend(chunk)
    _tokens_back(con, out)
    return out


def _tokens_back(con: sqlite3.Connection, rows: list[list]) -> None:
    """Each ``node.create`` that names its token count (schema 5, ``StoreWriter.write_journal``)
    given its tokens again, from ``node_tokens``; one with its tokens inline (schema 4, bundles,
    the KV-event watcher's stores) is left as it is."""
    named = [m for m in rows if m[2] == ev.NODE_CREATE and isinstance(m[6], list)
             and len(m[6]) == 3 and type(m[6][2]) is int]
    if not named:
        return
    bad = next((m for m in named if type(m[3]) is not int), None)
    if bad is not None:
        raise Malformed(f"journal mutation at seq {bad[0]}: node.create of node {bad[3]!r:.40}, "
                        "expected a node id (an integer)")
    ids = sorted({m[3] for m in named})
    blobs = dict(con.execute("SELECT node, tokens FROM node_tokens WHERE node IN "
                             "(SELECT value FROM json_each(?))", (json.dumps(ids),)))
    for m in named:
        n = m[6][2]
        blob = blobs.get(m[3])
        if blob is None:
            raise Malformed(f"journal mutation at seq {m[0]}: node.create of node {m[3]} names "
                            f"{n!r:.40} tokens, and node_tokens has no row for it")
        try:
            toks = unpack_tokens(blob)
        except ValueError as e:
            raise Malformed(f"node_tokens row of node {m[3]}: {e}") from None
        if len(toks) != n:
            raise Malformed(f"journal mutation at seq {m[0]}: node.create of node {m[3]} "
                            f"names {n!r:.40} tokens, its node_tokens row holds {len(toks)}")
        m[6] = [m[6][0], m[6][1], toks.tolist()]


def decode_mutation(m: list) -> tuple:
    """A decoded journal entry as the mutation tuple ``cache.snapshot.replay`` takes."""
    seq, op_id, kind, node, comp, tier, v = m
    if kind == ev.NODE_CREATE:
        parent, extra_key, tokens = v
        v = (parent, _hashable(extra_key), tuple(tokens))
    return (seq, op_id, kind, node, comp, tier, v)


def _hashable(v: object) -> object:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


__all__ = ["JSON_SHAPES", "NULLABLE_INT64", "decode", "decode_column", "decode_mutation",
           "enqueued_by", "int_columns", "journal_rows", "journal_top", "json_type", "op_attrs",
           "shaped"]
