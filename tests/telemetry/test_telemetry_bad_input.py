"""Bad input to the store and bundle readers: files people attach to bug reports are untrusted.

Every case ends, within a time bound, in one ``ValueError`` / ``TypeError`` (or
``FileNotFoundError`` for a missing file) that names the file or the bad value. Hostile
bundles are "re-signed" (row counts and digests recomputed) where the point is that the shape
checks, not the digests, must stop them.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.telemetry.analysis.load import load, load_bundle
from radixscope.telemetry.capture.bundle import write_bundle
from radixscope.telemetry.capture.flight import KeyframedFlightRecorder
from radixscope.telemetry.store import keyframes
from radixscope.telemetry.store.bundle_format import table_digest
from tests.kits.cachekit import Driver, make_config

BOUND_S = 20.0  # generous on a shared 2-core box; a hang is what is being ruled out


def within(fn: Callable[[], object], seconds: float = BOUND_S) -> BaseException | None:
    """Run ``fn`` on a daemon thread; the exception it raised (None if none). Fails the test
    when it is still running after ``seconds`` (SQLite releases the GIL while it steps, and
    a Python loop is preempted, so a hang shows up here instead of hanging the suite)."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            r = fn()
            if hasattr(r, "close"):
                r.close()
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still running after {seconds} s (a hang)"
    return out[0]


def expect(fn: Callable[[], object], exc: type[BaseException], *names: str) -> str:
    err = within(fn)
    assert isinstance(err, exc), f"expected {exc.__name__}, got {err!r}"
    msg = str(err)
    for n in names:
        assert n in msg, (n, msg)
    assert "Traceback" not in msg
    return msg


# ---- fixtures: one good store and one good bundle, copied per case ---------------------------
@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("good") / "store.db"
    tel = telemetry.setup(store=path, mode="inline", capture_host_spans=False, keyframe_every=40)
    c = HiRadixCache(make_config(("full",), device_tokens=64, host_tokens=128),
                     recorder=tel.recorder)
    d = Driver(c)
    for i in range(60):
        d.insert([i % 5, i % 3, i, 7, 8], req_id=f"r{i}")
        if i % 4 == 0:
            c.poll()
    tel.close()
    return path


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory) -> Path:
    c = HiRadixCache(make_config(device_tokens=512, host_tokens=1024),
                     recorder=KeyframedFlightRecorder(capacity=64))
    d = Driver(c)
    for i in range(12):
        d.insert([1, 2, 3, i, i + 1], req_id=f"r{i}")
    return write_bundle(c, tmp_path_factory.mktemp("goodb") / "bundle.db")


def copy(src: Path, tmp: Path, name: str = "case.db") -> Path:
    dst = tmp / name
    shutil.copy(src, dst)
    return dst


def sql(path: Path, *statements: str, args: tuple = ()) -> None:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s, args) if args else con.executescript(s)
    con.commit()
    con.close()


def resign(path: Path) -> None:
    """Recompute a bundle's manifest (row counts and digests) after an edit: what someone
    crafting a hostile bundle would do."""
    con = sqlite3.connect(path)
    meta = json.loads(con.execute("SELECT value FROM info WHERE key='bundle'").fetchone()[0])
    meta["rows"] = {t: _count(con, t) for t in meta["rows"]}
    meta["digests"] = {t: table_digest(con, t) for t in meta["digests"]}
    con.execute("UPDATE info SET value = ? WHERE key='bundle'", (json.dumps(meta),))
    con.commit()
    con.close()


def _count(con: sqlite3.Connection, table: str) -> int:
    if table == "mutations":
        return con.execute("SELECT coalesce(sum(json_array_length(data)), 0) FROM journal"
                           ).fetchone()[0]
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def edit_info(path: Path, key: str, change: Callable[[object], object]) -> None:
    con = sqlite3.connect(path)
    v = json.loads(con.execute("SELECT value FROM info WHERE key=?", (key,)).fetchone()[0])
    con.execute("UPDATE info SET value=? WHERE key=?", (json.dumps(change(v)), key))
    con.commit()
    con.close()


def edit_keyframes(path: Path, change: Callable[[dict], object]) -> None:
    con = sqlite3.connect(path)
    for seq, snap in con.execute("SELECT seq, snapshot FROM keyframes").fetchall():
        # keyframes are stored compressed with token references (resolved here so that a
        # change sees plain nodes), or as inline JSON text
        d = keyframes.load(con, snap).to_dict() if isinstance(snap, bytes) else json.loads(snap)
        new = change(d)
        con.execute("UPDATE keyframes SET snapshot=? WHERE seq=?",
                    (new if isinstance(new, str) else json.dumps(new), seq))
    con.commit()
    con.close()


def cycle(d: dict) -> dict:
    """Nodes 1 and 2 each other's parent (node 2 first re-parented under 1)."""
    nodes = d["nodes"]
    ids = [n[0] for n in nodes if n[1] is not None][:2]
    if len(ids) < 2:
        return d
    for n in nodes:
        if n[0] == ids[0]:
            n[1] = ids[1]
        if n[0] == ids[1]:
            n[1] = ids[0]
    return d


def orphan(d: dict) -> dict:
    for n in d["nodes"]:
        if n[1] is not None:
            n[1] = 987654
            break
    return d


def unknown_node(path: Path, create: bool = False) -> None:
    """Append a journal chunk whose mutation sets a component on a node that does not exist
    (or creates a node under a parent that does not exist)."""
    con = sqlite3.connect(path)
    top = con.execute("SELECT max(seq_last) FROM journal").fetchone()[0]
    kf = con.execute("SELECT max(seq) FROM keyframes").fetchone()[0]
    s = max(top or 0, kf or 0) + 1
    m = ([s, 0, ev.NODE_CREATE, 424242, None, None, [424243, None, [1, 2]]] if create
         else [s, 0, ev.COMP_STATE, 424242, "full", "device", [1, None, 0, 0]])
    con.execute("INSERT INTO journal VALUES (?, ?, ?)", (s, s, json.dumps([m])))
    con.commit()
    con.close()


def damage_pages(path: Path) -> None:
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for p in range(2, len(data) // page):  # every page but the first: b-tree pages garbled
        data[p * page + 8:p * page + 64] = b"\xa5" * 56
    path.write_bytes(bytes(data))


def sqlite_file(path: Path, *statements: str) -> Path:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()
    return path


# ---- files that are not stores -------------------------------------------------------------
OPENERS = {"open_store": telemetry.open_store, "load": load}


def _garbage(tmp: Path) -> Path:
    p = tmp / "garbage.db"
    p.write_bytes(os.urandom(5000))
    return p


def _empty(tmp: Path) -> Path:
    p = tmp / "empty.db"
    p.write_bytes(b"")
    return p


def _fifo(tmp: Path) -> Path:
    p = tmp / "pipe.db"
    os.mkfifo(p)
    return p


def _header_only(tmp: Path) -> Path:
    p = tmp / "header.db"
    src = sqlite_file(tmp / "src.db", "CREATE TABLE t (x)")
    p.write_bytes(src.read_bytes()[:100])
    return p


def _bare_number_schema(tmp: Path) -> Path:  # issue 12 item 6: AttributeError before
    return sqlite_file(tmp / "foreign.db", "CREATE TABLE info (key TEXT, value TEXT)",
                       "INSERT INTO info VALUES ('schema', '2')")


def _schema_string(tmp: Path) -> Path:
    return sqlite_file(tmp / "foreign.db", "CREATE TABLE info (key TEXT, value TEXT)",
                       "INSERT INTO info VALUES ('schema', '\"radixscope.telemetry\"')")


def _schema_not_json(tmp: Path) -> Path:
    return sqlite_file(tmp / "foreign.db", "CREATE TABLE info (key TEXT, value TEXT)",
                       "INSERT INTO info VALUES ('schema', '{nope')")


def _schema_huge(tmp: Path) -> Path:
    p = sqlite_file(tmp / "foreign.db", "CREATE TABLE info (key TEXT, value TEXT)")
    sql(p, "INSERT INTO info VALUES ('schema', ?)",
        args=(json.dumps({"name": "radixscope.telemetry", "pad": "x" * 20_000_000}),))
    return p


def _info_recursive_view(tmp: Path) -> Path:
    return sqlite_file(tmp / "foreign.db", "CREATE VIEW info AS WITH RECURSIVE c(x) AS "
                       "(SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT 'schema' AS key, "
                       "x AS value FROM c")


def _foreign(tmp: Path) -> Path:
    return sqlite_file(tmp / "foreign.db", "CREATE TABLE t (x)")


NOT_STORES = {
    "garbage bytes": (_garbage, ValueError, "not an SQLite file"),
    "empty file": (_empty, ValueError, "is empty"),
    "directory": (lambda tmp: tmp, ValueError, "is a directory"),
    "missing file": (lambda tmp: tmp / "missing.db", FileNotFoundError, "missing.db"),
    "fifo": (_fifo, ValueError, "not a regular file"),
    "/proc file": (lambda tmp: Path("/proc/self/status"), ValueError, "not an SQLite file"),
    "/dev/null": (lambda tmp: Path("/dev/null"), ValueError, "not a regular file"),
    "header only": (_header_only, ValueError, "truncated"),
    "foreign sqlite": (_foreign, ValueError, "not a radixscope telemetry store"),
    "schema a bare number": (_bare_number_schema, ValueError, "not a radixscope telemetry store"),
    "schema a string": (_schema_string, ValueError, "not a radixscope telemetry store"),
    "schema not json": (_schema_not_json, ValueError, "not a radixscope telemetry store"),
    "schema row 20 MB": (_schema_huge, ValueError, "not a radixscope telemetry store"),
    "info a recursive view": (_info_recursive_view, ValueError,
                              "not a radixscope telemetry store"),
}


@pytest.mark.parametrize("opener", list(OPENERS))
@pytest.mark.parametrize("case", list(NOT_STORES))
def test_files_that_are_not_stores(case, opener, tmp_path):
    make, exc, words = NOT_STORES[case]
    path = make(tmp_path)
    name = str(Path(path).expanduser().absolute())
    expect(lambda: OPENERS[opener](path), exc, name, words)


# ---- stores that were damaged or crafted ------------------------------------------------------
def _version(v: object) -> Callable[[Path], None]:
    return lambda p: edit_info(p, "schema", lambda s: {**s, "version": v})


STORE_CASES = {
    "schema version 1": (_version(1), "has schema version 1"),
    "schema version 2": (_version(2), "has schema version 2"),
    "schema version 3": (_version(3), "has schema version 3"),
    "schema version 7": (_version(7), "has schema version 7"),
    "schema version true": (_version(True), "has schema version True"),
    "recursive mutations view": (lambda p: sql(p, "DROP VIEW mutations; CREATE VIEW mutations "
                                               "AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
                                               "SELECT x + 1 FROM c) SELECT x AS seq FROM c"),
                                 "unexpected or altered ['view mutations']"),
    "table replaced by a view": (lambda p: sql(p, "DROP TABLE keyframes; CREATE VIEW keyframes "
                                               "AS SELECT 1 AS seq, 2 AS ts_ns, '{}' AS snapshot"),
                                 "view keyframes"),
    "extra trigger": (lambda p: sql(p, "CREATE TRIGGER t AFTER INSERT ON ops BEGIN "
                                    "DELETE FROM ops; END"), "trigger t"),
    "truncated to half": (lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2]),
                          "truncated"),
    "damaged pages": (damage_pages, "damaged"),
}


@pytest.mark.parametrize("opener", list(OPENERS))
@pytest.mark.parametrize("case", list(STORE_CASES))
def test_damaged_or_crafted_stores(case, opener, good_store, tmp_path):
    path = copy(good_store, tmp_path)
    change, words = STORE_CASES[case]
    change(path)
    expect(lambda: OPENERS[opener](path), ValueError, str(path), words)


TREE_CASES = {
    "keyframe parent cycle": (lambda p: edit_keyframes(p, cycle), "cycle"),
    "keyframe missing parent": (lambda p: edit_keyframes(p, orphan), "987654"),
    "keyframe not json": (lambda p: edit_keyframes(p, lambda d: "{oops"), "JSONDecodeError"),
    "keyframe nested 100k deep": (lambda p: edit_keyframes(p, lambda d: "[" * 100_000),
                                  "not a valid cache snapshot"),
    "keyframe not a snapshot": (lambda p: edit_keyframes(p, lambda d: {"nodes": 5}),
                                "not a valid cache snapshot"),
    "journal chunk not a list": (lambda p: sql(p, "UPDATE journal SET data = '{\"a\": 1}'"),
                                 "journal chunk is malformed"),
    "journal names an unknown node": (lambda p: unknown_node(p), "does not replay"),
    "journal creates an orphan": (lambda p: unknown_node(p, create=True), "424243"),
}


@pytest.mark.parametrize("case", list(TREE_CASES))
def test_crafted_trees_and_journals_in_a_store(case, good_store, tmp_path):
    """A store opens (its schema is right) but its keyframes or journal are hostile: rebuilding
    the tree raises a ValueError naming the file in bounded time, never loops or KeyErrors."""
    path = copy(good_store, tmp_path)
    change, words = TREE_CASES[case]
    change(path)

    def rebuild() -> None:
        with telemetry.open_store(path) as r:
            r.state_at(r.last_seq())
    expect(rebuild, ValueError, str(path), words)


def _a_created_node(path: Path) -> int:
    """The last node the journal creates (its node.create names a token count: schema 5)."""
    con = sqlite3.connect(path)
    try:
        chunks = [json.loads(d) for (d,) in con.execute("SELECT data FROM journal")]
    finally:
        con.close()
    made = [m for ch in chunks for m in ch if m[2] == ev.NODE_CREATE]
    assert made and all(type(m[6][2]) is int for m in made)
    return made[-1][3]


NODE_TOKEN_CASES = {
    "row missing": (lambda n: ("DELETE FROM node_tokens WHERE node = ?", (n,)), "has no row"),
    "a token short": (lambda n: ("UPDATE node_tokens SET tokens = substr(tokens, 1, "
                                 "length(tokens) - 4) WHERE node = ?", (n,)), "holds"),
    "not packed": (lambda n: ("UPDATE node_tokens SET tokens = X'64000000000000F03F' "
                              "WHERE node = ?", (n,)), "not a packed token array"),
    "text": (lambda n: ("UPDATE node_tokens SET tokens = 'I1234' WHERE node = ?", (n,)),
             "not a packed token array"),
}


@pytest.mark.parametrize("case", list(NODE_TOKEN_CASES))
def test_a_created_nodes_tokens_damaged_in_node_tokens(case, good_store, tmp_path):
    """The journal's node.create names its token count and the reader fetches the tokens from
    ``node_tokens``: a row missing, short or not packed is a ValueError naming the file and
    the node, from every reader of the journal."""
    path = copy(good_store, tmp_path)
    node = _a_created_node(path)
    make, words = NODE_TOKEN_CASES[case]
    statement, args = make(node)
    sql(path, statement, args=args)
    with telemetry.open_store(path) as r:
        expect(r.journal, ValueError, str(path), str(node), words)
        expect(r.mutations, ValueError, str(path), str(node), words)


def _append_create(path: Path, node: str, count: str) -> None:
    """Append a journal chunk with one node.create whose node id and token count are the JSON
    texts given (what a crafted file can hold)."""
    con = sqlite3.connect(path)
    top = con.execute("SELECT max(seq_last) FROM journal").fetchone()[0] or 0
    s = top + 1
    data = f'[[{s}, 0, "{ev.NODE_CREATE}", {node}, null, null, [1, null, {count}]]]'
    con.execute("INSERT INTO journal VALUES (?, ?, ?)", (s, s, data))
    con.commit()
    con.close()


JOURNAL_VALUE_CASES = {
    "node id a float": (lambda p: _append_create(p, "1.0", "3"), "expected a node id"),
    "node id a string": (lambda p: _append_create(p, '"1"', "3"), "expected a node id"),
    "count of 5,000 digits": (lambda p: _append_create(p, "424242", "9" * 5000),
                              "journal chunk is malformed"),
    "count of a node with no row": (lambda p: _append_create(p, "424242", "3"), "has no row"),
}


@pytest.mark.parametrize("case", list(JOURNAL_VALUE_CASES))
def test_a_crafted_node_create_is_one_clear_error(case, good_store, tmp_path):
    """A node.create naming its token count with an id that is not an integer (which could
    otherwise borrow another node's tokens), a count past json's digit limit, or no
    node_tokens row: one ValueError naming the file, short, from every reader of the
    journal."""
    path = copy(good_store, tmp_path)
    change, words = JOURNAL_VALUE_CASES[case]
    change(path)
    with telemetry.open_store(path) as r:
        for read in (r.journal, r.mutations):
            msg = expect(read, ValueError, str(path), words)
            assert len(msg) < 600, msg[:200]


def test_an_info_value_past_jsons_digit_limit_is_a_clear_error(good_store, tmp_path):
    path = copy(good_store, tmp_path)
    sql(path, "UPDATE info SET value = ? WHERE key = 'stats'", args=("9" * 5000,))
    with telemetry.open_store(path) as r:
        expect(r.info, ValueError, str(path), "not JSON text")


# ---- bundles ----------------------------------------------------------------------------------
def _live(change: Callable[[dict], dict]) -> Callable[[Path], None]:
    def apply(p: Path) -> None:
        edit_info(p, "live_snapshot", change)
        resign(p)
    return apply


BUNDLE_CASES = {
    "live snapshot parent cycle, re-signed": (_live(cycle), "cycle"),
    "live snapshot missing parent, re-signed": (_live(orphan), "987654"),
    "recursive mutations view": (lambda p: sql(p, "DROP VIEW mutations; CREATE VIEW mutations "
                                               "AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
                                               "SELECT x + 1 FROM c) SELECT x AS seq FROM c"),
                                 "view mutations"),
    "info row edited": (lambda p: edit_info(p, "config", lambda c: {**c, "device": "evil"}),
                        "do not match the manifest"),
    "failure row edited": (lambda p: edit_info(p, "failure", lambda f: {**f, "op": "nope"}),
                           "do not match the manifest"),
    "ops row edited": (lambda p: sql(p, "UPDATE ops SET req_id = 'x'"),
                       "do not match the manifest"),
    "manifest without digests": (lambda p: edit_info(p, "bundle", lambda m: {
        k: v for k, v in m.items() if k != "digests"}), "do not match the manifest"),
    "manifest a list": (lambda p: edit_info(p, "bundle", lambda m: [1, 2]),
                        "is not a radixscope.bundle manifest"),
    "journal names an unknown node, re-signed": (lambda p: (unknown_node(p), resign(p)),
                                                 "does not replay"),
}


@pytest.mark.parametrize("case", list(BUNDLE_CASES))
def test_hostile_bundles(case, good_bundle, tmp_path):
    path = copy(good_bundle, tmp_path)
    change, words = BUNDLE_CASES[case]
    change(path)

    def open_and_walk() -> None:
        with load_bundle(path) as b:  # opening, then everything a notebook walks
            b.nodes()
            b.state_at(b.last_seq())
            b.nodes(b.last_seq())
    expect(open_and_walk, ValueError, str(path), words)


# ---- wrong arguments to reader methods --------------------------------------------------------
ARG_CASES = {
    "state_at(-1)": (lambda r: r.state_at(-1), ValueError, "seq -1"),
    "state_at('x')": (lambda r: r.state_at("x"), TypeError, "'x'"),
    "state_at(1.5)": (lambda r: r.state_at(1.5), TypeError, "1.5"),
    "state_at(True)": (lambda r: r.state_at(True), TypeError, "True"),
    "state_at(None)": (lambda r: r.state_at(None), TypeError, "None"),
    "state_at(10**30)": (lambda r: r.state_at(10**30), ValueError, str(10**30)),
    "state_at(last + 1)": (lambda r: r.state_at(r.last_seq() + 1), ValueError, "past the last"),
    "mutations('a')": (lambda r: r.mutations("a"), TypeError, "'a'"),
    "journal(0, 2**64)": (lambda r: r.journal(0, 2**64), ValueError, str(2**64)),
    "ops(op=5)": (lambda r: r.ops(op=5), TypeError, "5"),
    "keyframe('0')": (lambda r: r.keyframe("0"), TypeError, "'0'"),
    "events(kind=[1])": (lambda r: r.events(kind=[1]), TypeError, "[1]"),
}


@pytest.mark.parametrize("case", list(ARG_CASES))
def test_wrong_arguments_to_reader_methods(case, good_store):
    call, exc, words = ARG_CASES[case]
    with telemetry.open_store(good_store) as r:
        expect(lambda: call(r), exc, words)


def test_nodes_of_a_bundle_with_a_bad_seq(good_bundle):
    with load_bundle(good_bundle) as b:
        expect(lambda: b.nodes("x"), TypeError, "'x'")
        expect(lambda: b.nodes(-5), ValueError, str(good_bundle), "seq -5")


def test_the_good_files_still_read(good_store, good_bundle):
    """The fixtures themselves pass every check (so the cases above fail for their edit)."""
    with telemetry.open_store(good_store) as r:
        assert r.state_at(r.last_seq()).seq == r.last_seq()
        assert r.run_status()["clean"]
    with load_bundle(good_bundle) as b:
        assert len(b.nodes()) == len(b.snapshot().nodes)
        assert b.state_at(b.last_seq()) == b.snapshot()


# ---- the CLI: one line, exit 2 ------------------------------------------------------------------
CLI_FILES = {
    "schema a bare number": lambda good, tmp: _bare_number_schema(tmp),
    "damaged pages": lambda good, tmp: _edited(good, tmp, damage_pages),
    "keyframe parent cycle": lambda good, tmp: _edited(good, tmp,
                                                       lambda p: edit_keyframes(p, cycle)),
    "journal names an unknown node": lambda good, tmp: _edited(good, tmp, unknown_node),
    "recursive mutations view": lambda good, tmp: _edited(
        good, tmp, STORE_CASES["recursive mutations view"][0]),
}


def _edited(good: Path, tmp: Path, change: Callable[[Path], object]) -> Path:
    p = copy(good, tmp)
    change(p)
    return p


@pytest.mark.parametrize("command", ["doctor", "export"])
@pytest.mark.parametrize("case", list(CLI_FILES))
def test_cli_reading_a_bad_store_prints_one_line(case, command, good_store, tmp_path, capsys):
    from radixscope.engine.cli import main

    path = CLI_FILES[case](good_store, tmp_path)
    extra = ["--perfetto", str(tmp_path / "t.json")] if command == "export" else []
    code: list[int] = []
    assert within(lambda: code.append(main([command, str(path), *extra]))) is None
    err = capsys.readouterr().err.splitlines()
    if command == "export" and case in ("keyframe parent cycle", "journal names an unknown node"):
        assert code == [0] and err == []  # export never rebuilds the tree: its rows are fine
        return
    assert code == [2] and len(err) == 1, err
    assert err[0].startswith(f"radixscope {command}: error: ") and str(path) in err[0]


# ---- rows of the wrong shape: valid JSON (or SQLite values) the readers cannot use ------------
@pytest.fixture(scope="module")
def run_store(tmp_path_factory) -> Path:
    """A served workload (``tests/kits/ui_store``): transfers enqueued by ops, admission
    events, a violation, pool samples, compressed keyframes."""
    from tests.kits.ui_store import make_store

    path = tmp_path_factory.mktemp("run") / "store.db"
    make_store(path, requests=12)
    return path


@pytest.fixture(scope="module")
def engine_store(tmp_path_factory) -> Path:
    """``radixscope run``: the engine's request spans and their resource."""
    from radixscope.engine.cli import main

    path = tmp_path_factory.mktemp("engine") / "store.db"
    assert main(["run", "--requests", "6", "--store", str(path), "--no-progress"]) == 0
    return path


def edit_mutation(path: Path, kind: str, at: tuple[int, ...], value: object) -> None:
    """Set ``at`` (an index path into the mutation) of the first ``kind`` mutation."""
    con = sqlite3.connect(path)
    for seq_first, data in con.execute("SELECT seq_first, data FROM journal").fetchall():
        chunk = json.loads(data)
        m = next((m for m in chunk if m[2] == kind), None)
        if m is not None:
            for i in at[:-1]:
                m = m[i]
            m[at[-1]] = value
            con.execute("UPDATE journal SET data = ? WHERE seq_first = ?",
                        (json.dumps(chunk), seq_first))
            break
    con.commit()
    con.close()


def _export(tmp: Path) -> Callable[[object], object]:
    return lambda r: telemetry.export_perfetto(r.path, tmp / "t.json")


def _at_first_create(r) -> object:
    """The state right after the journal's first ``node.create``."""
    m = r.mutations()
    return r.state_at(int(m[m["kind"] == ev.NODE_CREATE]["seq"].iloc[0]))


def _replayed(r) -> object:
    """The state just before the second keyframe: the journal replayed from the first."""
    kfs = r.keyframes()["seq"]
    return r.state_at(int(kfs.iloc[1]) - 1 if len(kfs) > 1 else r.last_seq())


LAST_OP = "(SELECT max(op_id) FROM ops)"
SHAPE_CASES = {  # source store, edit, the reads that must fail, words in the error
    "ops attrs a JSON array": (
        "run", lambda p: sql(p, "UPDATE ops SET attrs = '[1,2,3]'"), ("ops", "spans", "export"),
        ("ops row op_id=1", "attrs is a JSON array, expected a JSON object")),
    "ops attrs JSON null": (
        "run", lambda p: sql(p, f"UPDATE ops SET attrs = 'null' WHERE op_id = {LAST_OP}"),
        ("ops", "spans", "export"), ("op_id=", "attrs is JSON null")),
    "transfer enqueued_by a list": (
        "run", lambda p: sql(p, "UPDATE ops SET attrs = json_set(attrs, '$.enqueued_by', "
                             "json('[3]')) WHERE op = 'transfer'"),
        ("spans", "export"), ("attrs.enqueued_by is [3]", "expected an op id")),
    "ops start_ns text": (
        "run", lambda p: sql(p, f"UPDATE ops SET start_ns = 'soon' WHERE op_id = {LAST_OP}"),
        ("ops", "spans", "export"), ("op_id=", "start_ns", "'soon'", "expected")),
    "ops error a blob": (
        "run", lambda p: sql(p, "UPDATE ops SET error = x'00ff' WHERE error IS NOT NULL"),
        ("spans",), ("error is b'\\x00\\xff', expected text or null",)),
    "events attrs a JSON array": (
        "run", lambda p: sql(p, "UPDATE events SET attrs = '[1]'"), ("events", "export"),
        ("events row id=1", "attrs is a JSON array, expected a JSON object")),
    "events seq text": (
        "run", lambda p: sql(p, "UPDATE events SET seq = 'x' WHERE id = 2"), ("events", "export"),
        ("events row id=2", "seq is 'x', expected an integer or null")),
    "violations details a number": (
        "run", lambda p: sql(p, "UPDATE violations SET details = '5'"), ("violations", "export"),
        ("violations row id=1", "details is a JSON integer, expected a JSON object")),
    "metrics capacity text": (
        "run", lambda p: sql(p, "UPDATE metrics SET capacity = 'lots' WHERE rowid = 2"),
        ("metrics", "export"), ("metrics row seq=", "capacity is 'lots', expected an integer")),
    "keyframes ts_ns a real": (
        "run", lambda p: sql(p, "UPDATE keyframes SET ts_ns = 1.5"), ("keyframes",),
        ("keyframes row seq=0", "ts_ns is 1.5")),
    "info stats a JSON array": (
        "run", lambda p: sql(p, "UPDATE info SET value = '[1]' WHERE key = 'stats'"), ("stats",),
        ("key='stats' is a JSON array",)),
    "journal seq_last text": (
        "run", lambda p: sql(p, "UPDATE journal SET seq_last = 'x'"),
        ("last_seq", "run_status"), ("seq_last is 'x', expected an integer",)),
    "journal node a list": (
        "run", lambda p: edit_mutation(p, ev.NODE_TOUCH, (3,), [1]), ("mutations",),
        ("node is [1], expected a node id",)),
    "journal node past 64 bits": (
        "run", lambda p: edit_mutation(p, ev.NODE_TOUCH, (3,), 2**70), ("mutations",),
        (f"node is {2**70}",)),
    "journal creates a node under a list": (
        "run", lambda p: edit_mutation(p, ev.NODE_CREATE, (6, 0), [1]), ("state_at_create",),
        ("has parent [1], which is not a node id",)),
    "spans attributes a JSON array": (
        "engine", lambda p: sql(p, "UPDATE spans SET attributes = '[1]'"), ("spans", "export"),
        ("spans row span_id=", "attributes is a JSON array, expected a JSON object")),
    "spans links a JSON object": (
        "engine", lambda p: sql(p, "UPDATE spans SET links = '{}'"), ("spans", "export"),
        ("links is a JSON object, expected a JSON array",)),
    "spans op_id text": (
        "engine", lambda p: sql(p, "UPDATE spans SET op_id = 'x'"), ("spans", "export"),
        ("op_id is 'x', expected an integer or null",)),
    "resource attributes a JSON string": (
        "engine", lambda p: sql(p, "UPDATE resources SET attributes = '\"x\"'"), ("spans",),
        ("resources row id=1", "attributes is a JSON string")),
    "info resource a JSON array": (
        "engine", lambda p: sql(p, "UPDATE info SET value = '[1]' WHERE key = 'resource'"),
        ("spans",), ("key='resource'", "value is a JSON array")),
}
READS = {"ops": lambda r: r.ops(), "spans": lambda r: r.spans(), "events": lambda r: r.events(),
         "violations": lambda r: r.violations(), "metrics": lambda r: r.metrics(),
         "keyframes": lambda r: r.keyframes(), "stats": lambda r: r.stats(),
         "last_seq": lambda r: r.last_seq(), "run_status": lambda r: r.run_status(),
         "mutations": lambda r: r.mutations(), "state_at": _replayed,
         "state_at_create": _at_first_create}


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_rows_of_the_wrong_shape(case, run_store, engine_store, tmp_path):
    """A store that opens (schema and JSON fine) but whose rows do not have the writer's shape:
    each read that uses them, and the Perfetto export, raises one ValueError naming the file,
    the row and the shape expected (before: AttributeError / TypeError tracebacks)."""
    source, change, reads, words = SHAPE_CASES[case]
    path = copy(run_store if source == "run" else engine_store, tmp_path)
    change(path)
    with telemetry.open_store(path) as r:
        for read in reads:
            call = _export(tmp_path) if read == "export" else READS[read]
            msg = expect(lambda call=call: call(r), ValueError, str(path), *words)
            assert "\n" not in msg, msg


@pytest.mark.parametrize("case", ["ops attrs a JSON array", "events attrs a JSON array",
                                  "transfer enqueued_by a list", "metrics capacity text"])
def test_cli_export_of_rows_of_the_wrong_shape_prints_one_line(case, run_store, tmp_path,
                                                              capsys):
    from radixscope.engine.cli import main

    _source, change, _reads, words = SHAPE_CASES[case]
    path = copy(run_store, tmp_path)
    change(path)
    code: list[int] = []
    assert within(lambda: code.append(main(["export", str(path), "--perfetto",
                                            str(tmp_path / "t.json")]))) is None
    err = capsys.readouterr().err.splitlines()
    assert code == [2] and len(err) == 1, err
    assert err[0].startswith("radixscope export: error: ") and str(path) in err[0]
    assert words[-1] in err[0]


def test_export_of_events_and_violations_without_a_seq(run_store, tmp_path):
    """A NULL seq is valid (recorded before a cache attached): the mark carries ``seq: null``
    (before: ``int(pd.NA)`` raised TypeError)."""
    path = copy(run_store, tmp_path)
    sql(path, "UPDATE events SET seq = NULL WHERE id = 1; UPDATE violations SET seq = NULL")
    telemetry.export_perfetto(path, tmp_path / "t.json")
    marks = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
             if e["ph"] == "i"]
    with telemetry.open_store(path) as r:
        assert len(marks) == len(r.events()) + len(r.violations()) == 14
    assert [m["args"]["seq"] for m in marks if m["cat"] == "violation"] == [None]
    seqs = [m["args"]["seq"] for m in marks if m["cat"] == "event"]
    assert seqs[0] is None and all(isinstance(s, int) for s in seqs[1:])


def test_the_run_stores_read_whole(run_store, engine_store, tmp_path):
    """The shape cases' sources pass every check (so each case fails for its edit)."""
    for path in (run_store, engine_store):
        with telemetry.open_store(path) as r:
            for read in READS.values():
                read(r)
            assert r.stats() == r.info()["stats"]
        telemetry.export_perfetto(path, tmp_path / "t.json")
