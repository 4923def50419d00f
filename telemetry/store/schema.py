"""The embedded store's schema, creation and connections (SQLite in WAL mode).

One file per run. It is created complete (schema and ``info`` rows) under a temporary name and
renamed into place, so a reader never sees a half-made store. One writer connection (the sink's)
appends; readers open ``file:...?mode=ro`` and, thanks to WAL, read consistent snapshots while
it writes.

Tables (all times are wall-clock ns; ids of spans and traces are lowercase hex):

- ``info(key, value)``: JSON values: ``schema``, ``created_ns``, ``cache`` (the attach info),
  ``settings``, ``stats`` (dropped / failure counters), ``gaps``, ``run`` (a unique id, the
  host process's pid and host name) and, once the writer has closed the store, ``closed``
  (``clean``: closed by ``tel.close()``, or false when the host process ended without closing;
  ``ts_ns``, ``last_seq``). A store without ``closed`` was never closed: its run was killed
  (or is still writing).
- ``ops``: one row per cache operation (``op_id`` is the rowid), with its seq range and its
  span's ids.
- ``journal``: the mutations in chunks (one per writer batch, keyed by the first seq): ``data``
  is a JSON array of ``[seq, op_id, kind, node, comp, tier, value]``. One SQLite row per
  mutation cost the writer more than everything else it does per op; a chunk is one row and
  one C-encoded JSON text. A ``node.create``'s value is ``[parent, extra_key, n_tokens]``: the
  tokens are in ``node_tokens`` (schema 5; a schema 4 store, a bundle and the KV-event
  watcher's store hold them inline, ``[parent, extra_key, tokens]``). The ``mutations`` view
  expands the chunks to one row per state change (``value`` as JSON text, as stored), for
  SQL; ``StoreReader`` decodes chunks directly and puts the tokens back.
- ``keyframes(seq, ts_ns, snapshot)``: at attach ``CacheSnapshot.to_dict()`` JSON text; every K
  mutations zlib-compressed JSON whose nodes name their tokens by reference ``[origin, start,
  end]`` into ``node_tokens`` (``telemetry.store.keyframes``), so a keyframe grows with the node count,
  not the token count.
- ``node_tokens(node, tokens)``: each created node's tokens, once (packed uint32/uint64).
- ``metrics``: per component x tier pool samples (capacity, available, evictable, protected,
  in_flight) at a seq.
- ``spans`` (+ ``resources``): every finished span, the cache's and the host process's.
- ``violations``, ``events``: invariant violations; admission decisions and other events.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEMA_VERSION = 6  # 2: ops keyed by op_id, mutations in journal chunks; 3: node_tokens,
#                    keyframes as compressed JSON with token references; 4: component states
#                    per tier (``comp.state`` and keyframe nodes carry ``[lens, refs]``, one
#                    entry per ``Tier``); 5: a journal ``node.create`` may name its token count
#                    instead of its tokens, which are in ``node_tokens``; 6: a ``node.delete``
#                    drops the values its node still held, with no ``comp.state`` clearing
#                    them first (``cache/events.py``)
# 4 and 5 have the same tables (4: node.create entries hold their tokens); their node.delete
# follows a comp.state clear of each value, which every reader takes the same way
READABLE_VERSIONS = (4, 5, 6)
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
CREATE TABLE kv_blocks (
    medium TEXT NOT NULL, grp INTEGER NOT NULL, hash INTEGER NOT NULL, parent_hash INTEGER,
    token_ids TEXT NOT NULL, stored_seq INTEGER NOT NULL, removed_seq INTEGER,
    stored_ns INTEGER NOT NULL, removed_ns INTEGER);
CREATE INDEX kv_blocks_live ON kv_blocks (medium, grp, hash, removed_seq);
"""

TABLES = ("info", "ops", "journal", "keyframes", "node_tokens", "metrics", "resources",
          "spans", "violations", "events", "kv_blocks")


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
                ("settings", json.dumps(settings, default=repr)),
                ("run", json.dumps({"id": uuid.uuid4().hex, "pid": os.getpid(),
                                    "host": socket.gethostname()}))]
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


WRITER_CACHE_KIB = 256  # the writer's page cache (SQLite's default: 2,000 KiB)


def connect_writer(path: str | os.PathLike) -> sqlite3.Connection:
    """The single writer connection: WAL, ``synchronous=NORMAL``, explicit transactions.

    Its page cache is ``WRITER_CACHE_KIB``: it appends, so a page it writes is rarely read
    again, and a larger cache only fills the last-level cache it shares with the cache's
    thread. With 256 KiB the writer's CPU an op did not change, and telemetry's cost at 1 k
    nodes read 7.3 % (median of 11 runs) against 7.7 % (8 runs, alternated): within the
    noise, and free (bench/RESULTS.md, #17, twenty-eighth round)."""
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("PRAGMA busy_timeout=30000")
    con.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
    return con


def connect_reader(path: str | os.PathLike, *, integrity_budget_s: float = 1.0
                   ) -> sqlite3.Connection:
    """A read-only connection (``mode=ro`` URI) to a verified store, waiting out a busy writer.

    Nothing the file defines is trusted before it is checked: the file must be SQLite (header),
    its ``sqlite_master`` must list exactly this schema's tables, indexes and views (so no view
    or trigger a file brings is ever run), its schema row must name this version, and SQLite's
    ``quick_check`` must find no damage within ``integrity_budget_s`` (the check stops there on
    a big store; damage found later still raises ``ValueError``, see ``StoreReader``).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``path`` is a directory, not an SQLite file, damaged, not a radixscope
            store, or another schema version (naming the file).
    """
    p = Path(path).expanduser().absolute()
    check_file(p)
    uri = f"{p.as_uri()}?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                              timeout=30.0)
    except sqlite3.Error as e:
        raise ValueError(f"{str(p)!r} cannot be opened as a radixscope telemetry store "
                         f"(SQLite says: {e})") from None
    try:
        con.execute("PRAGMA busy_timeout=30000")
        con.execute("PRAGMA trusted_schema=OFF")
        with time_bound(con, OPEN_BUDGET_S, f"opening {str(p)!r}"):
            _verify_schema(con, p)
        con.execute("PRAGMA trusted_schema=ON")  # verified: the mutations view is ours
        quick_check(con, p, integrity_budget_s)
    except sqlite3.Error as e:
        con.close()
        raise ValueError(f"{str(p)!r} is not a readable radixscope telemetry store "
                         f"(SQLite says: {e})") from None
    except BaseException:
        con.close()
        raise
    return con


OPEN_BUDGET_S = 10.0  # reading sqlite_master and the schema row: milliseconds on a real store
_SQLITE_MAGIC = b"SQLite format 3\x00"
_MAX_SCHEMA_ROW = 4096  # bytes: the schema row is a small JSON object


def check_file(p: Path, kind: str = "telemetry store") -> None:
    """File-level checks before SQLite opens ``p``: present, a regular file, SQLite, not shorter
    than its header says.

    Raises:
        FileNotFoundError: nothing at ``p``.
        ValueError: a directory, not a regular file, not SQLite, or truncated.
    """
    if not p.exists():
        raise FileNotFoundError(f"no {kind} at {str(p)!r}")
    if p.is_dir():
        raise ValueError(f"{str(p)!r} is a directory, not a {kind}")
    if not p.is_file():
        raise ValueError(f"{str(p)!r} is not a regular file (a device, pipe or socket), not a "
                         f"{kind}")
    try:
        with open(p, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise ValueError(f"{str(p)!r} cannot be read: {e}") from None
    if not head:
        raise ValueError(f"{str(p)!r} is empty: not a {kind}")
    if not head.startswith(_SQLITE_MAGIC):
        raise ValueError(f"{str(p)!r} is not a radixscope {kind}: not "
                         f"an SQLite file (it starts with {head[:16]!r})")
    if len(head) < 100:
        raise ValueError(f"{str(p)!r} is truncated: {len(head)} bytes, shorter than an SQLite "
                         "header")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    valid = head[24:28] == head[92:96] and pages > 0
    size = p.stat().st_size
    if valid and size < page * pages and not p.with_name(p.name + "-wal").exists():
        raise ValueError(f"{str(p)!r} is truncated: its SQLite header says {pages} pages of "
                         f"{page} bytes ({page * pages} bytes) but the file has {size} bytes")


@contextmanager
def time_bound(con: sqlite3.Connection, seconds: float, what: str) -> Iterator[None]:
    """Interrupt any statement ``con`` runs inside the block once ``seconds`` have passed
    (SQLite's progress handler), raising ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + seconds
    fired = [False]

    def check() -> int:
        if time.monotonic() > deadline:
            fired[0] = True
            return 1
        return 0

    con.set_progress_handler(check, 10_000)
    try:
        yield
    except sqlite3.OperationalError:
        if fired[0]:
            raise TimeoutError(f"{what} took longer than {seconds:g} s (stopped)") from None
        raise
    finally:
        con.set_progress_handler(None, 0)


def quick_check(con: sqlite3.Connection, p: Path, budget_s: float | None) -> bool:
    """SQLite's page-level ``quick_check`` on ``con``, stopped after ``budget_s`` (None: no
    limit). Returns whether it ran to the end.

    Raises:
        ValueError: SQLite finds damage (naming the file).
    """
    try:
        if budget_s is None:
            res = [r[0] for r in con.execute("PRAGMA quick_check(5)").fetchall()]
        else:
            with time_bound(con, budget_s, "quick_check"):
                res = [r[0] for r in con.execute("PRAGMA quick_check(5)").fetchall()]
    except TimeoutError:
        return False
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{str(p)!r} is damaged: SQLite says {e}") from None
    if res != ["ok"]:
        raise ValueError(f"{str(p)!r} is damaged: SQLite quick_check says "
                         f"{'; '.join(str(r) for r in res[:3])}")
    return True


@functools.cache
def expected_master() -> frozenset[tuple[str, str, str, str]]:
    """``(type, name, tbl_name, sql)`` of every object this schema creates."""
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(SCHEMA)
        return frozenset(_master(con))
    finally:
        con.close()


def _master(con: sqlite3.Connection) -> list[tuple[str, str, str, str]]:
    rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    return [(t, nm, tb, " ".join(str(sql).split()) if sql is not None else "")
            for t, nm, tb, sql in rows]


def _verify_schema(con: sqlite3.Connection, p: Path) -> None:
    have = _master(con)
    names = {r[1] for r in have}
    if "info" not in names:
        raise ValueError(f"{str(p)!r} is not a radixscope telemetry store (an SQLite file "
                         "without an info table)")
    row = con.execute("SELECT CASE WHEN length(CAST(value AS BLOB)) <= ? THEN value END "
                      "FROM info WHERE key = 'schema'", (_MAX_SCHEMA_ROW,)).fetchone() \
        if ("table", "info", "info") in {r[:3] for r in have} else None
    try:
        schema = json.loads(row[0]) if row and isinstance(row[0], str) else None
    except (ValueError, RecursionError):
        schema = None
    if not isinstance(schema, dict) or schema.get("name") != SCHEMA_NAME:
        raise ValueError(f"{str(p)!r} is not a radixscope telemetry store (its info table has "
                         f"no {SCHEMA_NAME} schema row)")
    version = schema.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ValueError(f"telemetry store {str(p)!r} has schema version {version!r}; this "
                         f"reader reads {', '.join(map(str, READABLE_VERSIONS))}")
    want = expected_master()
    got = frozenset(have)
    if got != want:
        extra = sorted(f"{t} {nm}" for t, nm, _tb, _s in got - want)
        missing = sorted(f"{t} {nm}" for t, nm, _tb, _s in want - got)
        raise ValueError(f"{str(p)!r} does not have the radixscope telemetry schema (version "
                         f"{SCHEMA_VERSION}): unexpected or altered {extra[:5]}, missing "
                         f"{missing[:5]}; it is not read")
