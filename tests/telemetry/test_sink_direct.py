"""Direct records (``cache/_direct.h``): the native ledger writes each mutation into a buffer of
its own as it is made and hands the op's record to the native sink in one C call. The oracle is
the same ledger with ``direct = False`` (tuples made, then encoded by the sink): on every workload
and every case the direct path hands back (a value that is not plain, the sink full or busy, an
attribute marshal cannot take, a failing or nested op, ``take`` / ``muts`` mid-op, recording or
direct records turned off mid-op, a freed cache, a ledger or recorder swapped), the sink's bytes
and what reached the recorder's and the cache's callbacks are the same. The ledger reads the
clock itself, so each record's two times are zeroed before records are compared; where the
list path holds an ``array``, a direct one decoded holds its ``bytes`` (marshal writes both
alike), so values are compared as marshal writes them."""

from __future__ import annotations

import contextvars
import ctypes
import datetime
import gc
import marshal
import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixscope.cache import HiRadixCache, ledger, recording
from radixscope.telemetry.capture import crash_window as window_
from radixscope.telemetry.capture.replaycheck import replay_check
from radixscope.telemetry.record import sink as sink_mod
from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.record.encode import Chunk, decode, part_records
from radixscope.telemetry.record.recorder import TelemetryRecorder
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config, random_session
from tests.kits.finalizers import MID_CALL, BufferRuns, finalizer_runs
from tests.kits.require import missing

C = ledger._built
KEY = array("Q", range(5))  # a created node's tokens: written from its buffer
CREATE = ("node.create", 3, None, None, (1, None, KEY))


@pytest.fixture(autouse=True, scope="module")
def _native() -> None:
    if C is None or sink_mod.Sink is None:
        missing("native", "the native ledger or encoder was not built (no C compiler at "
                "install, or RADIXSCOPE_NATIVE=0)")


def _plain(x):
    if isinstance(x, array):
        return x.tobytes()
    if type(x) in (tuple, list):
        return type(x)(_plain(v) for v in x)
    if type(x) is dict:
        return {k: _plain(v) for k, v in x.items()}
    return x


def wire(x) -> bytes:
    """``x`` as marshal writes it (an ``array`` and its ``bytes`` alike); where marshal cannot
    (an odd value), its repr with every ``array`` as its ``bytes``."""
    try:
        return marshal.dumps(x, 2)
    except ValueError:
        return repr(_plain(x)).encode()


def timeless(rec: tuple) -> tuple:
    return (rec[0], rec[1], 0, 0, *rec[4:])


class Owner:
    """Stands in for the cache: its callbacks, kept as comparable values."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.led = None

    def _op_failed(self, op_id, op, start, end, req_id, ctx, seq_first, error) -> None:
        # what the cache does: the failing op's record, with the mutations taken
        self.calls.append(("_op_failed", op_id, op, req_id, seq_first, repr(error),
                           wire(self.led.take())))

    def _after_error(self, op, error) -> None:
        self.calls.append(("_after_error", op, repr(error)))

    def _recorder_failed(self, op, error) -> None:
        self.calls.append(("_recorder_failed", op, type(error).__name__))


class Seen:
    """A native sink whose ``full`` and ``fallback`` keep what reached them."""

    def __init__(self, limit: int = 1 << 40, parent_of=None) -> None:
        self.back: list[tuple] = []
        self.lookups = 0
        self.parent = parent_of or (lambda ctx: (len(str(ctx)), 0, 0, False))
        self.sink = sink_mod.Sink(lambda o, m: self.back.append(("full", wire(timeless(o)),
                                                                 wire(m))),
                                  lambda o, m: self.back.append(("fallback", wire(timeless(o)),
                                                                 wire(m))),
                                  self.parent_of)
        self.sink.limit = limit

    def parent_of(self, ctx):
        self.lookups += 1
        return self.parent(ctx)

    def output(self) -> tuple:
        """The records written (their count, size and each one's bytes, timeless) and the
        parent lookups made."""
        n, data = self.sink.peek()
        return (n, len(data), [wire(timeless(r)) for r in part_records(Chunk(n, data))],
                self.lookups)


def attrs_of(build=None) -> dict:
    return {"op": build or (lambda cache, out, args: (out, args))}


def run_both(scenario, limit: int = 1 << 40, attrs=None, context=None, parent_of=None,
             python: bool = True) -> tuple:
    """``scenario(led)`` on a native ledger into a native sink, direct and not (and on
    ``PyLedger`` when ``python``): what the sink wrote and what reached the callbacks, the same
    each way; returns it."""
    got = {}
    impls = [("direct", C.Ledger), ("listed", C.Ledger)] + ([("python", ledger.PyLedger)]
                                                             if python else [])
    for name, impl in impls:
        seen, owner = Seen(limit, parent_of), Owner()
        led = owner.led = impl(owner, seen.sink, context, attrs or attrs_of(), True)
        if impl is C.Ledger:
            led.direct = name == "direct"
            assert led.direct is (name == "direct")
        out = scenario(led)
        got[name] = (seen.output(), seen.back, owner.calls, out, led.seq, led.op_id)
    assert got["direct"] == got["listed"]
    if python:
        assert got["direct"] == got["python"]
    return got["direct"]


def test_a_ledger_records_directly_only_into_a_native_sink() -> None:
    owner = Owner()
    sink = Seen().sink
    led = C.Ledger(owner, sink, None, {}, True)
    assert led.direct is True
    led.direct = False
    assert led.direct is False
    led.direct = True
    assert led.direct is True
    for record in (lambda o, m: None, TelemetryRecorder(Health(), encoder="python").record):
        other = C.Ledger(owner, record, None, {}, True)
        other.direct = True
        assert other.direct is False  # no table on the recorder's type
    # a direct ledger decodes what it hands over outside a record: bytes where m got an array
    led.m(*CREATE)
    assert led.take() == [(1, 0, *CREATE[:4], (1, None, KEY.tobytes()))]
    led.direct = False
    led.m(*CREATE)
    assert led.take()[0][6][2] is KEY


def _capsule(name: bytes, version: int):
    """A capsule as an extension makes one, holding ``version`` where the table's is."""
    table = ctypes.create_string_buffer(64)
    ctypes.c_int.from_buffer(table).value = version
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                   ctypes.c_void_p]
    return new(ctypes.addressof(table), name, None), table, name


@pytest.mark.parametrize("name, version", [(b"radixscope.direct_api", 99),
                                           (b"another.api", 1)])
def test_a_recorder_with_another_table_is_called_as_a_callable(name, version) -> None:
    capsule, *keep = _capsule(name, version)
    got = []

    class Recorder:
        _radixscope_direct_api = capsule

        def __call__(self, op, muts) -> None:
            got.append((op[0], muts))

    owner = Owner()
    led = C.Ledger(owner, Recorder(), None, attrs_of(), True)
    assert led.direct is False
    led.run("op", None, lambda: led.m(*CREATE))
    assert got == [(1, [(1, 1, *CREATE)])] and got[0][1][0][6][2] is KEY


# ---- workloads: a cache, direct or not, ships the same records ----------------------------

def _shipped(comps, seed: int, direct: bool, swaps: bool) -> tuple:
    rec = TelemetryRecorder(Health(), encode_batch=7, queue_capacity=50, overflow="drop")
    c = HiRadixCache(make_config(comps, device_tokens=48, host_tokens=96), recorder=rec)
    c._ledger.direct = direct
    assert c._ledger.direct is direct
    rng, pick = random.Random(seed), random.Random(-seed)  # the workload's, the swaps'
    blobs: list[bytes] = []

    def drain() -> None:
        """The recorder's queue drained; with ``swaps``, another ledger, direct or not or
        Python, the counters carried over (as benches swap them)."""
        rec.seal()
        blobs.extend(b for _, b in rec.take(1 << 30))
        if not swaps:
            return
        old = c._ledger
        new = pick.choice([C.Ledger, C.Ledger, ledger.PyLedger])(
            c, rec.record, recording._CONTEXT, recording.OP_ATTRS, old.on)
        new.seq, new.op_id, new.cur_op = old.seq, old.op_id, old.cur_op
        if isinstance(new, C.Ledger):
            new.direct = pick.random() < 0.5
        c.use_ledger(new)

    random_session(c, rng, 150, 4, drain)
    rec.seal()
    blobs.extend(b for _, b in rec.take(1 << 30))
    records = [r for b in blobs for r in decode(b)]
    return ([wire(timeless(r)) for r in records], rec.health.snapshot()["dropped"], c.seq,
            sum(r[9] is not None for r in records))


@pytest.mark.parametrize("comps", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_cache_ships_the_same_records_direct_or_not(comps, seed) -> None:
    """A small queue (some records dropped, counted), batches of 7 (the sink's ``full``), a
    few ops handed back, errors recorded; and ledgers swapped mid-session."""
    direct = _shipped(comps, seed, True, False)
    assert direct == _shipped(comps, seed, False, False)
    assert len(direct[0]) > 100 and direct[1]["op"] > 0
    assert direct[3] > 0  # failing ops' records
    assert direct == _shipped(comps, seed, True, True)


def test_pending_mutations_read_mid_op_are_the_ops_own_and_it_ships_the_same() -> None:
    """The crash window reads ``pending_mutations()`` while an op runs: the op's mutations so
    far, and the op goes on (and ships) as it would have."""
    got = []
    for direct in (True, False):
        rec = TelemetryRecorder(Health())
        c = HiRadixCache(make_config(("full",)), recorder=rec)
        c._ledger.direct = direct
        d, pending = Driver(c), []
        d.insert([1, 2, 3, 4], req_id="a")
        d.insert([1, 2, 5], req_id="b")  # a split
        touch = c.touch

        def reading(node, touch=touch, c=c, pending=pending) -> None:
            touch(node)
            pending.append(wire(c.pending_mutations()))

        c.touch = reading
        c.match_prefix([1, 2, 3, 4, 9], req_id="m")
        d.insert([1, 2, 5, 7], req_id="c")
        rec.seal()
        records = [timeless(r) for _, b in rec.take(1 << 30) for r in decode(b)]
        got.append((pending, [wire(r) for r in records]))
    assert got[0] == got[1]
    first = marshal.loads(got[0][0][0])
    assert [m[2] for m in first] == ["node.touch"] and len(got[0][0]) >= 2


# ---- the cases the direct path hands back ---------------------------------------------------

class IntLike(int):
    pass


def _deep(n: int):
    x = 0
    for _ in range(n):
        x = (x,)
    return x


NOT_PLAIN = [2.5, 2**70, IntLike(3), {1, 2}, "lone \ud800", _deep(70), {"a": 1.5},
             bytearray(b"ab"), memoryview(b"abc"), [1, {2: (3, 2.5)}]]


@pytest.mark.parametrize("odd", NOT_PLAIN, ids=[type(v).__name__ for v in NOT_PLAIN])
def test_a_value_that_is_not_plain_sends_its_op_to_the_list_path(odd) -> None:
    seen = []

    def scenario(led) -> None:
        def body() -> None:
            led.m(*CREATE)
            led.m("k", 4, "full", "device", odd)
            led.m(*CREATE)
            if isinstance(led, C.Ledger):  # the op's list: the first decoded, the last kept
                seen.append((type(led.muts[0][6][2]), led.muts[2][6][2] is KEY))

        led.run("op", "r", body)
        led.run("op", "r", lambda: led.m(*CREATE))  # the next op direct again
        led.m(*CREATE)
        if isinstance(led, C.Ledger):
            seen.append(type(led.take()[0][6][2]))

    run_both(scenario)
    assert seen == [(bytes, True), bytes, (array, True), array]


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | st.text(max_size=8)
    | st.floats(allow_nan=False) | st.binary(max_size=8)
    | st.lists(st.integers(0, 2**64 - 1), max_size=5).map(lambda v: array("Q", v)),
    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3), max_leaves=12)


@given(ops=st.lists(st.lists(st.tuples(values, values), max_size=5), min_size=1, max_size=4))
@settings(max_examples=150, deadline=None)
def test_random_mutations_are_written_as_the_list_path_writes_them(ops) -> None:
    def scenario(led) -> None:
        for muts in ops:
            led.run("op", "r", lambda muts=muts: [led.m("k", node, None, None, v)
                                                 for node, v in muts])

    run_both(scenario, python=False)


def test_a_full_sink_gets_the_records_objects() -> None:
    def scenario(led) -> None:
        for i in range(3):
            led.run("op", f"r{i}", lambda: led.m(*CREATE))

    (n, *_), back, *_ = run_both(scenario, limit=1)
    assert n == 1 and [b[0] for b in back] == ["full", "full"]
    assert marshal.loads(back[0][2]) == [(2, 2, *CREATE[:4], (1, None, KEY.tobytes()))]


@pytest.mark.parametrize("case", ["attrs", "parent", "deep"])
def test_a_record_the_sink_cannot_append_takes_the_sinks_own_way(case) -> None:
    """An attribute marshal cannot take and a failed parent lookup go to the sink's
    ``fallback``; an attribute nested past the sink's depth goes to marshal's writer."""
    attrs = {"attrs": datetime.date(2026, 1, 1), "deep": _deep(80)}.get(case, 1)

    def parent_of(ctx):
        if case == "parent":
            raise LookupError("no span")
        return (1, 2, 0, False)

    def scenario(led) -> None:
        led.run("op", "r", lambda: led.m(*CREATE))
        led.run("other", "r", lambda: led.m(*CREATE))

    build = {"op": lambda cache, out, args: attrs, "other": lambda cache, out, args: 2}
    (n, _, records, _), back, *_ = run_both(scenario, attrs=build, parent_of=parent_of)
    if case == "deep":
        assert n == 2 and back == []
    else:
        assert [b[0] for b in back] == ["fallback"] * (1 + (case == "parent"))
        assert marshal.loads(back[0][2]) == [(1, 1, *CREATE[:4], (1, None, KEY.tobytes()))]


SORTS = frozenset(range(50))  # marshal's writer sorts it: allocates, so a collection can run


@pytest.mark.parametrize("trigger", MID_CALL)
def test_a_busy_sink_hands_the_record_made_meanwhile_to_its_fallback(trigger: str) -> None:
    """The op's attribute is written by marshal's writer, which collects, and a finalizer then
    runs a whole op (before Python 3.12); or it is a buffer whose ``__buffer__`` runs that op
    (from 3.12, where no collection runs there): its record finds the sink mid-record."""
    def inner() -> None:
        led = Cycle.led
        led.run("op", "inner", lambda: led.m(*CREATE))

    class Cycle:
        def __del__(self) -> None:
            inner()

    def build(cache, out, args):
        if out != "outer":
            return 1
        if trigger == "buffer":
            return (BufferRuns(inner),)
        gc.collect()  # counts from zero: the next collection is inside the sort
        c = Cycle()
        c.me = c
        return (SORTS,)

    def scenario(led) -> None:
        Cycle.led = led
        old = gc.get_threshold()
        gc.set_threshold(20)
        try:
            led.run("op", "outer", lambda: led.m(*CREATE) or "outer")
        finally:
            gc.set_threshold(*old)

    (n, _, records, _), back, *_ = run_both(scenario, attrs={"op": build}, python=False)
    assert n == 1 and marshal.loads(records[0])[4] == "outer"
    assert [(b[0], marshal.loads(b[1])[4]) for b in back] == [("fallback", "inner")]
    assert marshal.loads(back[0][2]) == [(2, 2, *CREATE[:4], (1, None, KEY.tobytes()))]


def test_a_failing_op_leaves_its_mutations_for_op_failed() -> None:
    def scenario(led) -> None:
        def body() -> None:
            led.m(*CREATE)
            led.m("k", 1, None, None, 2.5)
            raise ValueError("bad 7")

        with pytest.raises(ValueError):
            led.run("op", "r", body)
        led.run("op", "r", lambda: led.m(*CREATE))

    out, back, calls, *_ = run_both(scenario)
    assert [c[0] for c in calls] == ["_op_failed"] and len(marshal.loads(calls[0][6])) == 2
    assert out[0] == 1


def test_nested_ops_and_take_and_muts_mid_op_and_recording_turned_off() -> None:
    seen = []

    def scenario(led) -> None:
        def inner() -> None:
            led.m("inner", 1, None, None, None)

        def body() -> None:
            led.m(*CREATE)
            led.run("op", "nested", inner)
            taken = led.take()
            led.m("after take", 1, None, None, 1)
            live = led.muts  # pending_mutations() reads it: the op's own list from now on
            led.m("after muts", 1, None, None, KEY)
            seen.append((wire(taken), wire(live), live is led.muts))
            led.on = False
            led.m("off", 1, None, None, 3)
            led.on = True

        led.run("op", "r", body)
        led.run("op", "r", lambda: led.m(*CREATE))

    (n, _, records, _), *_ = run_both(scenario)
    assert n == 2 and [m[2] for m in marshal.loads(records[0])[10]] == ["after take",
                                                                         "after muts"]
    assert [[m[2] for m in marshal.loads(x)] for x in seen[0][:2]] == \
        [["node.create", "inner"], ["after take", "after muts"]] and seen[0][2]
    assert len(set(seen)) == 1  # the same on each ledger


def test_direct_records_turned_off_and_on_mid_op_keep_the_order() -> None:
    def scenario(led) -> None:
        def body() -> None:
            led.m(*CREATE)
            if isinstance(led, C.Ledger):
                led.direct = not led.direct
            led.m("second", 1, None, None, KEY)
            if isinstance(led, C.Ledger):
                led.direct = not led.direct
            led.m("third", 1, None, None, KEY)

        led.run("op", "r", body)
        led.run("op", "r", body)

    (n, _, records, _), *_ = run_both(scenario)
    assert [[m[2] for m in marshal.loads(r)[10]] for r in records] == \
        [["node.create", "second", "third"]] * 2


def test_a_builders_mutations_and_a_recorder_swapped_mid_op_behave_as_before() -> None:
    """A builder's mutation goes with the next op; an ``__init__`` mid-op (another recorder)
    drops what the op recorded before it and hands the record to the new recorder."""
    def build(cache, out, args):
        cache.led.m("from attrs", 9, None, None, KEY)
        return ()

    got = []
    for impl, direct in ((C.Ledger, True), (C.Ledger, False), (ledger.PyLedger, None)):
        seen, other, owner = Seen(), Seen(), Owner()
        led = owner.led = impl(owner, seen.sink, None, {"op": build}, True)
        if direct is not None:
            led.direct = direct

        def body(led=led, owner=owner, other=other) -> None:
            led.m(*CREATE)
            led.__init__(owner, other.sink, None, {"op": build}, True)
            led.m("after init", 1, None, None, KEY)

        led.run("op", "r", lambda led=led: led.m(*CREATE))
        led.run("op", "r", body)
        led.run("op", "r", lambda: None)
        got.append((seen.output(), other.output(), owner.calls))
    assert got[0] == got[1] == got[2]
    (n, _, first, _), (m, _, moved, _), _ = got[0]
    assert n == 1 and [x[2] for x in marshal.loads(first[0])[10]] == ["node.create"]
    assert m == 2 and [[x[2] for x in marshal.loads(r)[10]] for r in moved] == \
        [["after init"], ["from attrs"]]


def test_a_freed_cache_fails_the_op_as_before() -> None:
    for direct in (True, False):
        owner, seen = Owner(), Seen()
        led = C.Ledger(owner, seen.sink, None, attrs_of(), True)
        led.direct = direct
        del owner
        gc.collect()
        with pytest.raises(RuntimeError, match="the ledger's cache was freed"):
            led.run("op", "r", lambda led=led: led.m(*CREATE))
        assert seen.output()[0] == 0 and led.take() == [] and led.seq == 1
        led.m(*CREATE)
        assert len(led.take()) == 1


def test_a_finalizer_recording_around_a_decode_keeps_the_order() -> None:
    """Decoding the buffer (a value not plain, ``take``) makes tuples, with the collector off
    (a finalizer run in the middle would find the mutations detached): a finalizer that records
    runs before or after it, its mutation after the decoded ones."""
    seen = Seen()
    owner = Owner()
    led = C.Ledger(owner, seen.sink, None, attrs_of(), True)

    values = [(i, None, KEY) for i in range(40)]
    for decode_by in ("not plain", "take"):
        for v in values:
            led.m("node.create", 3, None, None, v)
        with finalizer_runs(lambda: led.m("finalizer", 1, None, None, None)):
            if decode_by == "not plain":
                led.m("odd", 1, None, None, 2.5)
            got = led.take()
        gc.collect()
        got += led.take()
        kinds = [m[2] for m in got]
        assert "finalizer" in kinds and kinds[:40] == ["node.create"] * 40
        assert [m[0] for m in got] == sorted(m[0] for m in got)


def _collect_in(action, led, during):
    """``during(led)`` with ``action(led)`` run by a finalizer at the first collection inside
    it (the decode or the tuple it makes), and a collection after."""
    try:
        with finalizer_runs(lambda: action(led)):
            return during(led)
    finally:
        gc.collect()


@pytest.mark.parametrize("action", ["take", "op"])
def test_a_finalizer_taking_or_running_an_op_during_the_switch_to_the_list_leaves_nothing_behind(
        action) -> None:
    """An op that meets a value not plain goes on in list mode: its buffered mutations are
    decoded into ``muts``. A finalizer run by that (a ``take``, an op of its own) took ``muts``
    in between and left the decoded ones, or the new one, in a list no record read: a seq gap in
    the stream, the mutations still in ``muts`` after (before the fix: ``r`` shipped 1 of its 42,
    40 or 1 were left)."""
    stolen: list = []
    act = ((lambda led: stolen.extend(m[0] for m in led.take())) if action == "take" else
           (lambda led: led.run("op", "fin", lambda: led.m("fin", 9, None, None, None))))

    def scenario(led):
        def body():
            for i in range(40):
                led.m("node.create", i, None, None, (i, None, KEY))
            _collect_in(act, led, lambda led: led.m("odd", 1, None, None, 2.5))
            led.m("after", 2, None, None, 7)

        led.run("op", "r", body)
        led.run("op", "r2", lambda: led.m("next", 3, None, None, 1))
        return wire(led.take())

    run_both(scenario, python=False)  # (the Python ledger's tuples collect at other times)
    stolen.clear()
    seen, owner = Seen(), Owner()
    led = owner.led = C.Ledger(owner, seen.sink, None, attrs_of(), True)
    assert scenario(led) == wire([])
    recs = [r for _, blob in [seen.sink.peek()]
            for r in part_records(Chunk(seen.sink.n, blob))]
    shipped = [m[0] for r in recs for m in r[10]] + stolen
    assert sorted(shipped) == list(range(1, led.seq + 1))  # every seq once, none left


def test_a_finalizer_running_an_op_while_pending_mutations_are_read_ships_them_once() -> None:
    """A builder's mutations wait for the next op; the crash window reads them between ops
    (``pending_mutations``), and a finalizer runs an op during that read's decode: the
    mutations ship with it, once (before the fix: with neither op, left in ``muts``)."""
    def build(cache, out, args):
        if out == "first":
            for i in range(40):
                cache.led.m("node.create", i, None, None, (i, None, KEY))
        return ()

    def scenario(led):
        led.run("op", "first", lambda: "first")
        # (what the read returns depends on when the collection comes: not compared)
        _collect_in(lambda led: led.run("op", "fin", lambda: led.m("fin", 9, None, None, None)),
                    led, lambda led: list(led.muts))
        led.run("op", "second", lambda: led.m("second", 3, None, None, 1))
        return wire(led.take())

    got = run_both(scenario, attrs={"op": build}, python=False)
    n, blob = got[0][0], got[0][2]
    assert got[3] == wire([])
    seqs = sorted(m[0] for r in (marshal.loads(b) for b in blob) for m in r[10])
    assert seqs == list(range(1, 43)) and n == 3


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "listed"])
def test_a_capture_mid_op_replays_a_created_nodes_tokens_as_tokens(direct) -> None:
    """The crash window reads the running op's mutations (``pending_mutations``): decoded from
    the ledger's bytes, a created node's tokens come back as ``bytes``, which the window made an
    array again, as the recorder's decoding does (before: replayed as they were, each byte a
    token, and the capture's replay check failed)."""
    rec = TelemetryRecorder(Health())
    c = HiRadixCache(make_config(("full",)), recorder=rec)
    c._ledger.direct = direct
    d = Driver(c)
    d.insert([1, 2, 3, 4], req_id="a")
    got = []
    refresh = c.refresh_leaf

    def capturing(node) -> None:
        refresh(node)
        if not got:  # while insert runs, its node.create pending
            got.append((window_.capture(c, rec, None, None, None), c.snapshot()))

    c.refresh_leaf = capturing
    d.insert([7, 8, 9], req_id="b")
    win, live = got[0]
    created = [m for m in win.mutations if m[2] == "node.create"][-1]
    assert list(created[6][2]) == [7, 8, 9]
    assert replay_check(win.start, win.ops, win.mutations, live)[1]["ok"]


def test_the_context_reaches_the_sinks_parent_lookup_directly() -> None:
    var = contextvars.ContextVar("ctx", default="outer-span")

    def scenario(led) -> None:
        led.run("op", "r", lambda: None)
        token = var.set("inner-span-longer")
        try:
            led.run("op", "r", lambda: led.m(*CREATE))
        finally:
            var.reset(token)

    (n, _, records, _), *_ = run_both(scenario, context=var)
    assert [marshal.loads(r)[5] for r in records] == [(10, 0, 0, False), (17, 0, 0, False)]


class _Data:
    def __init__(self, values, refs) -> None:
        self.values, self.refs = values, refs


class _Node:
    def __init__(self, nid, data) -> None:
        self.id, self.data = nid, data


STATES = {  # a component's values and refs -> what ``state`` writes directly or hands back
    "plain": ([[1, 2], None, [3]], [0, 2, 0]),
    "no value": ([None, None, None], [0, 0, 0]),
    "refs a tuple": ([[1], None, None], (1, 0, 0)),
    "values a tuple": (([1], None, [2]), [0, 0, 0]),
    "a ref past 64 bits": ([[1], None, None], [2**70, 0, 0]),
    "a negative ref": ([[1], None, None], [-3, 0, 0]),
    "more refs than tiers": ([[1], None, None], [0] * 40),
    "a size not an int": ([2.5, None, None], [0, 0, 0]),
    "a size past 64 bits": ([2**70, None, None], [0, 0, 0]),
    "a size an int subclass": ([True, None, None], [0, 0, 0]),
}


def _size(v):
    return v if isinstance(v, (int, float)) else len(v)


@pytest.mark.parametrize("case", list(STATES))
def test_state_writes_a_components_state_as_the_tuples_would_be_written(case) -> None:
    values, refs = STATES[case]

    def scenario(led) -> None:
        led.set_states("comp.state", ("full",), ((_size,) * 3,))
        node = _Node(7, [_Data(values, refs)])
        led.run("op", "r", lambda: (led.state(node, 0), led.m(*CREATE), led.state(node, 0)))
        led.state(node, 0)
        return led.take()

    run_both(scenario)


@pytest.mark.parametrize("during", ["shrink", "rebind refs", "take", "direct off", "off"])
def test_a_size_callable_that_changes_things_leaves_state_as_the_python_ledger(during) -> None:
    def scenario(led) -> None:
        data = _Data([[1], [2, 3], None], [0, 1, 0])

        def size(v):
            if during == "shrink":
                data.values.clear()
            elif during == "rebind refs":
                data.refs = [5, 5, 5]
            elif during == "take":
                led.take()
            elif during == "direct off" and isinstance(led, C.Ledger):
                led.direct = False
            elif during == "off":
                led.on = False
            return len(v)

        led.set_states("comp.state", ("full",), ((size,) * 3,))
        led.run("op", "r", lambda: (led.m(*CREATE), led.state(_Node(2, [data]), 0)))
        return led.take()

    run_both(scenario)

def test_direct_records_are_the_bytes_marshal_writes_for_what_they_hold() -> None:
    """Strs (ASCII, not, a lone surrogate), ints (one digit, 64 bits, past them), bools and
    nested values in a record's fields, attributes and mutations, and parents from the sink's
    kept encoding and new ones: the sink's bytes are marshal's for the values they decode to
    (marshal reads and writes those values back to the same bytes), and the values are the
    ones given; a value that is not plain (the surrogate, the big int) sends only its op to the
    list path."""
    var = contextvars.ContextVar("ctx", default="a")
    parents = {"a": (1, 2, 1, False), "big": (2**100 + 7, 2**63 + 1, 1, True),
               "strs": ("trace-é", "span", 0, None)}
    seen, owner = Seen(parent_of=lambda ctx: parents[ctx]), Owner()
    led = owner.led = C.Ledger(owner, seen.sink, var, attrs_of(lambda cache, out, args: out),
                               True)
    assert led.direct is True
    leaves = ["op-é", "日本", "lone \ud800", "", 2**30, -2**30 - 1, 2**31, -2**63, 2**63 - 1,
              2**64, True, False, None, (1, None, (2, "é")), {"full": 3, "swa": -2**40}]
    contexts = ["a", "a", "big", "big", "strs", "a"] * 3
    given = []
    for i, leaf in enumerate(leaves):
        value, out = (i, leaf, array("Q", range(i))), (leaf, i, "x", None)

        def body(i=i, leaf=leaf, value=value, out=out):
            led.m("kind-é", 2**40 + i, "full", leaf if isinstance(leaf, str) else None, value)
            return out

        token = var.set(contexts[i])
        try:
            assert led.run("op", f"r-é{i}", body) == out
        finally:
            var.reset(token)
        given.append((parents[contexts[i]], out, value))
    n, data = seen.sink.peek()
    records = part_records(Chunk(n, data))
    assert data == b"".join(marshal.dumps(r, 2) for r in records)
    assert [(r[5], r[8], r[10][0][6]) for r in records] == [
        (parent, out, _plain(value)) for parent, out, value in given]
    assert seen.back == []
