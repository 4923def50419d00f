"""``StoreReader.blocks(seq)``: the KV blocks resident at a seq, as a DataFrame.

A store the watcher wrote keeps the engine's own hashes in ``kv_blocks``; a store of our own
cache rebuilds the tree at ``seq`` (``state_at``) and derives its blocks with the publisher's
hash (``blocks.snapshot_blocks``), so both answer with the hashes a KV-event consumer sees.
Hashes are 64-bit integer columns (``UInt64`` for unsigned hashes, ``Int64`` for signed ones
such as SGLang's; nullable, so a root block's missing parent is ``<NA>``, never a float).
"""

from __future__ import annotations

import json
import sqlite3

import pandas as pd

from radixscope.telemetry.kvevents.blocks import snapshot_blocks

COLUMNS = ["medium", "group", "hash", "parent_hash", "token_ids", "stored_seq"]


def is_external(con: sqlite3.Connection) -> bool:
    """Whether the watcher wrote this store (``info["engine"]["external"]``): its blocks are
    the engine's own, in ``kv_blocks``; a store of our own cache leaves that table empty."""
    row = con.execute("SELECT value FROM info WHERE key='engine'").fetchone()
    try:
        engine = json.loads(row[0]) if row else None
    except ValueError:
        return False
    return isinstance(engine, dict) and engine.get("external") is True


def blocks_frame(reader: object, seq: int | None = None) -> pd.DataFrame:
    """Blocks resident at ``seq`` (default: the end), sorted by medium, group, hash."""
    with reader._read() as con:  # type: ignore[attr-defined]  # noqa: SLF001
        external = is_external(con)
        if external:
            if seq is None:
                row = con.execute("SELECT value FROM info WHERE key='last_seq'").fetchone()
                seq = json.loads(row[0]) if row else 0
            rows = con.execute(
                "SELECT medium, grp, hash, parent_hash, token_ids, stored_seq FROM kv_blocks "
                "WHERE stored_seq <= ? AND (removed_seq IS NULL OR removed_seq > ?)",
                (seq, seq)).fetchall()
            info = con.execute("SELECT value FROM info WHERE key='kv_events'").fetchone()
            unsigned = bool(info and json.loads(info[0]).get("hash_unsigned"))
    if external:
        data = [(m, g, h, p, json.loads(t), s) for m, g, h, p, t, s in rows]
        if unsigned:
            data = [(m, g, h & (1 << 64) - 1, None if p is None else p & (1 << 64) - 1, t, s)
                    for m, g, h, p, t, s in data]
        dtype = "UInt64" if unsigned else "Int64"
    else:
        if seq is None:
            seq = reader.last_seq()  # type: ignore[attr-defined]
        snap = reader.state_at(seq)  # type: ignore[attr-defined]
        data = [(m, g, b.hash, b.parent, list(b.tokens), None)
                for (m, g), bl in snapshot_blocks(snap).items() for b in bl.values()]
        dtype = "UInt64"
    cols = list(zip(*data, strict=True)) if data else [()] * len(COLUMNS)
    df = pd.DataFrame({  # built per column: a None among ints must never make floats
        "medium": pd.array(list(cols[0]), dtype="object"),
        "group": pd.array(list(cols[1]), dtype="int64"),
        "hash": pd.array(list(cols[2]), dtype=dtype),
        "parent_hash": pd.array(list(cols[3]), dtype=dtype),
        "token_ids": pd.Series(list(cols[4]), dtype="object"),
        "stored_seq": pd.array(list(cols[5]), dtype="Int64"),
    })
    return df.sort_values(["medium", "group", "hash"], kind="stable").reset_index(drop=True)
