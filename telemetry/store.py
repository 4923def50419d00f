"""The embedded store's schema, creation and connections (SQLite in WAL mode).

One file per run. It is created complete (schema and ``info`` rows) under a temporary name and
renamed into place, so a reader never sees a half-made store. One writer connection (the sink's)
appends; readers open ``file:...?mode=ro`` and, thanks to WAL, read consistent snapshots while
it writes.

Tables (all times are wall-clock ns; ids of spans and traces are lowercase hex):

- ``info(key, value)``: JSON values: ``schema``, ``created_ns``, ``cache`` (the attach info),
  ``settings``, ``stats`` (dropped / failure counters), ``gaps``.
- ``ops``: one row per cache operation (``op_id`` is the rowid), with its seq range and its
  span's ids.
- ``journal``: the mutations in chunks (one per writer batch, keyed by the first seq): ``data``
  is a JSON array of ``[seq, op_id, kind, node, comp, tier, value]``. One SQLite row per
  mutation cost the writer more than everything else it does per op; a chunk is one row and
  one C-encoded JSON text. The ``mutations`` view expands it to one row per state change
  (``value`` as JSON text), for SQL; ``StoreReader`` decodes chunks directly.
- ``keyframes(seq, ts_ns, snapshot)``: at attach ``CacheSnapshot.to_dict()`` JSON text; every K
  mutations zlib-compressed JSON whose nodes name their tokens by reference ``[origin, start,
  end]`` into ``node_tokens`` (``telemetry.keyframes``), so a keyframe grows with the node count,
  not the token count.
- ``node_tokens(node, tokens)``: each created node's tokens, once (packed uint32/uint64).
- ``metrics``: per component x tier pool samples (capacity, available, evictable, protected,
  in_flight) at a seq.
- ``spans`` (+ ``resources``): every finished span, the cache's and the host process's.
- ``violations``, ``events``: invariant violations; admission decisions and other events.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

SCHEMA_VERSION = 3  # 2: ops keyed by op_id, mutations in journal chunks; 3: node_tokens,
#                    keyframes as compressed JSON with token references
SCHEMA_NAME = "radixscope.telemetry"

SCHEMA = """
CREATE TABLE info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE ops (
    op_id INTEGER PRIMARY KEY, op TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
    req_id TEXT, seq_first INTEGER NOT NULL, seq_last INTEGER NOT NULL,
    trace_id TEXT, span_id TEXT, parent_span_id TEXT, attrs TEXT NOT NULL, error TEXT);
CREATE TABLE journal (seq_first INTEGER PRIMARY KEY, seq_last INTEGER NOT NULL,
    data TEXT NOT NULL);
CREATE VIEW mutations AS SELECT
    json_extract(m.value, '$[0]') AS seq, json_extract(m.value, '$[1]') AS op_id,
    json_extract(m.value, '$[2]') AS kind, json_extract(m.value, '$[3]') AS node,
    json_extract(m.value, '$[4]') AS comp, json_extract(m.value, '$[5]') AS tier,
    json_quote(json_extract(m.value, '$[6]')) AS value
    FROM journal j, json_each(j.data) m;
CREATE TABLE keyframes (seq INTEGER PRIMARY KEY, ts_ns INTEGER NOT NULL, snapshot NOT NULL);
CREATE TABLE node_tokens (node INTEGER PRIMARY KEY, tokens BLOB NOT NULL);
CREATE TABLE metrics (
    seq INTEGER NOT NULL, ts_ns INTEGER NOT NULL, component TEXT NOT NULL, tier TEXT NOT NULL,
    capacity INTEGER NOT NULL, available INTEGER NOT NULL, evictable INTEGER NOT NULL,
    protected INTEGER NOT NULL, in_flight INTEGER NOT NULL);
CREATE INDEX metrics_seq ON metrics (seq);
CREATE TABLE resources (id INTEGER PRIMARY KEY, attributes TEXT NOT NULL UNIQUE);
CREATE TABLE spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT, name TEXT NOT NULL,
    kind TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
    status_code TEXT NOT NULL, status_message TEXT, attributes TEXT NOT NULL,
    events TEXT NOT NULL, links TEXT NOT NULL, resource_id INTEGER, scope TEXT, op_id INTEGER);
CREATE INDEX spans_trace ON spans (trace_id);
CREATE INDEX spans_op ON spans (op_id);
CREATE TABLE violations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts_ns INTEGER NOT NULL, seq INTEGER,
    kind TEXT NOT NULL, message TEXT NOT NULL, details TEXT NOT NULL);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts_ns INTEGER NOT NULL, seq INTEGER,
    kind TEXT NOT NULL, attrs TEXT NOT NULL);
"""

TABLES = ("info", "ops", "journal", "keyframes", "node_tokens", "metrics", "resources",
          "spans", "violations", "events")


def resolve_new_store(path: str | os.PathLike, overwrite: bool) -> Path:
    """Validate a path for a new store (before any process or thread starts).

    Args:
        path: where the store file goes; missing parent directories are created.
        overwrite: replace an existing file (and its ``-wal`` / ``-shm``) instead of failing.

    Returns:
        The absolute path.

    Raises:
        ValueError: the path is empty or names a directory.
        FileExistsError: a file is there and ``overwrite`` is False.
    """
    if path is None or str(path) == "":
        raise ValueError(f"telemetry store path {path!r}: must be a non-empty file path")
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise ValueError(f"telemetry store path {str(p)!r} is a directory, not a file")
    if p.exists():
        if not overwrite:
            raise FileExistsError(f"telemetry store {str(p)!r} already exists "
                                  "(pass overwrite=True to replace it)")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def create_store(path: Path, settings: dict, overwrite: bool = False) -> None:
    """Create an empty store at ``path`` atomically (schema + ``info`` rows).

    Args:
        path: a path validated by ``resolve_new_store``.
        settings: plain-data telemetry settings recorded under ``info['settings']``.
        overwrite: remove an existing store at ``path`` first.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    for q in (tmp, *_sidecars(tmp)):
        q.unlink(missing_ok=True)
    con = sqlite3.connect(tmp, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript("BEGIN;" + SCHEMA + "COMMIT;")
        rows = [("schema", json.dumps({"name": SCHEMA_NAME, "version": SCHEMA_VERSION})),
                ("created_ns", json.dumps(time.time_ns())),
                ("settings", json.dumps(settings, default=repr))]
        con.executemany("INSERT INTO info VALUES (?, ?)", rows)
    finally:
        con.close()  # checkpoints the WAL into the main file
    if overwrite:
        for q in (path, *_sidecars(path)):
            q.unlink(missing_ok=True)
    os.replace(tmp, path)
    for q in _sidecars(tmp):
        q.unlink(missing_ok=True)


def _sidecars(p: Path) -> tuple[Path, Path]:
    return (p.with_name(p.name + "-wal"), p.with_name(p.name + "-shm"))


def connect_writer(path: str | os.PathLike) -> sqlite3.Connection:
    """The single writer connection: WAL, ``synchronous=NORMAL``, explicit transactions."""
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("PRAGMA busy_timeout=30000")
    return con


def connect_reader(path: str | os.PathLike) -> sqlite3.Connection:
    """A read-only connection (``mode=ro`` URI) that waits out a busy writer.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``path`` is a directory, not an SQLite file, or not a radixscope store.
    """
    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise FileNotFoundError(f"no telemetry store at {str(p)!r}")
    if p.is_dir():
        raise ValueError(f"telemetry store path {str(p)!r} is a directory, not a store file")
    uri = f"{p.as_uri()}?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                              timeout=30.0)
        con.execute("PRAGMA busy_timeout=30000")
        row = con.execute("SELECT value FROM info WHERE key = 'schema'").fetchone()
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{str(p)!r} is not a radixscope telemetry store "
                         f"(SQLite says: {e})") from None
    schema = json.loads(row[0]) if row else {}
    if schema.get("name") != SCHEMA_NAME:
        con.close()
        raise ValueError(f"{str(p)!r} is not a radixscope telemetry store (no schema row)")
    if schema.get("version") != SCHEMA_VERSION:
        con.close()
        raise ValueError(f"telemetry store {str(p)!r} has schema version "
                         f"{schema.get('version')!r}; this reader reads {SCHEMA_VERSION}")
    return con
