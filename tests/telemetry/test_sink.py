"""The recorder's native encoder (``telemetry/record/_sink.c``): byte for byte what ``marshal``
writes, on random and odd values; everything it cannot take handed back to the recorder's
Python path in recording order; its limit, context memo and buffer; and a ``TelemetryRecorder``
on it shipping exactly what one on the Python encoder ships. In CI (``RADIXSCOPE_REQUIRE``
names ``native``) the module must have been built; the store's tests also run on the Python
encoder (``RADIXSCOPE_NATIVE=0``, in a subprocess)."""

from __future__ import annotations

import datetime
import marshal
import sys
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixscope.telemetry.record import sink as sink_mod
from radixscope.telemetry.record.drops import DROP_MUTATION, DROP_OP, Health
from radixscope.telemetry.record.encode import Chunk, decode, part_records
from radixscope.telemetry.record.recorder import TelemetryRecorder
from tests.kits.require import missing, pass_without_native

ROOT = Path(__file__).resolve().parents[2]
PARENT = (11, 22, 1, False)


def needs_native() -> None:
    if sink_mod.Sink is None:
        missing("native", "the native encoder was not built (no C compiler at install, or "
                "RADIXSCOPE_NATIVE=0)")


class Calls:
    """A sink's three callbacks, recording what reached them."""

    def __init__(self) -> None:
        self.full: list[tuple] = []
        self.fallback: list[tuple] = []
        self.contexts: list = []

    def sink(self, limit: int = 1 << 40):
        s = sink_mod.Sink(lambda op, m: self.full.append(op),
                          lambda op, m: self.fallback.append(op), self.parent_of)
        s.limit = limit
        return s

    def parent_of(self, ctx):
        self.contexts.append(ctx)
        return PARENT


def compact(op: tuple, muts: list) -> tuple:
    return (*op[:5], PARENT, *op[6:], muts)


def op_tuple(i: int, attrs=(1, "x"), ctx=None, req="r") -> tuple:
    return (i, "insert", 1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_500 + i, req, ctx,
            i, i, attrs, None)


def test_the_recorder_runs_on_the_native_encoder_when_it_is_built() -> None:
    needs_native()
    assert sink_mod.ENCODER == "native"
    assert sink_mod._sink.ABI == sink_mod.ABI
    rec = TelemetryRecorder(Health())
    assert rec.encoder == "native" and rec.record is rec._sink


leaves = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
          | st.sampled_from([0, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1, -2**63,
                             2**63, -2**63 - 1, 2**64])
          | st.text(max_size=40) | st.text(alphabet=st.characters(), max_size=5)
          | st.floats(allow_nan=False) | st.binary(max_size=40)
          | st.lists(st.integers(0, 2**64 - 1), max_size=30).map(lambda v: array("Q", v)))
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                      | st.lists(inner, max_size=4).map(tuple)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=25)


@given(ops=st.lists(st.tuples(st.lists(values, min_size=10, max_size=10),
                              st.lists(values, max_size=4)), min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_the_sink_writes_what_marshal_writes(ops) -> None:
    needs_native()
    calls = Calls()
    s = calls.sink()
    want = []
    for fields, muts in ops:
        op = tuple(fields)
        s(op, muts)
        want.append(marshal.dumps(compact(op, muts), 2))
    assert calls.fallback == [] and calls.full == []
    n, data = s.take()
    assert n == len(ops) and data == b"".join(want)
    assert part_records(Chunk(n, data)) == [marshal.loads(w) for w in want]


class IntLike(int):
    pass


@pytest.mark.parametrize("value", [
    {"full": 120, "swa": 0},  # an eviction's freed slots: written here, not by marshal
    {}, {"a": None, "b": True, "c": -2**40, "d": 2**70, "e": "lone \ud800"},
    {"full": 1.5}, {"full": {1, 2}}, {("a", 1): 2}, {"full": [1, 2]},  # marshal's writer, whole
    {**dict.fromkeys(range(3)), "x": 1}, {True: 0, 2.5: 2},
])
def test_a_dict_is_written_as_marshal_writes_it_in_the_dicts_order(value) -> None:
    needs_native()
    calls = Calls()
    s = calls.sink()
    op = op_tuple(1, attrs=("full", 120, value))
    muts = [(1, 1, "comp.state", 3, "full", None, value)]
    s(op, muts)
    assert calls.fallback == [] and s.take()[1] == marshal.dumps(compact(op, muts), 2)


@pytest.mark.parametrize("odd", [IntLike(3), datetime.date(2026, 1, 1), object(), {1, 2},
                                 "lone \ud800 surrogate", memoryview(b"abcd")[::2]])
def test_what_marshal_cannot_take_goes_back_and_leaves_the_buffer_as_it_was(odd) -> None:
    needs_native()
    calls = Calls()
    s = calls.sink()
    s(op_tuple(1), [])
    before = s.peek()
    op = op_tuple(2, attrs=(1, [2, (3, odd)]))
    s(op, [(1, 2, "node.touch", 3, None, None, None)])
    try:
        marshal.dumps(odd, 2)
    except ValueError:
        assert calls.fallback == [op] and s.peek() == before
    else:  # marshal takes it (a lone surrogate): so does the sink, through marshal's writer
        assert calls.fallback == [] and s.n == 2
        assert s.take()[1] == before[1] + marshal.dumps(compact(op, [(1, 2, "node.touch", 3,
                                                                      None, None, None)]), 2)
    assert s.recorded_seq == 2


LEAVES = ["", "r12", "é", "日本語", "\U0001f600 emoji", "lone \ud800", "a" * 300, 0, -1,
          2**30 - 1, 2**30, -2**30, -2**30 - 1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**62,
          2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64, 2**200, -2**200, True, False, None]


@pytest.mark.parametrize("leaf", LEAVES, ids=[repr(v)[:20] for v in LEAVES])
def test_every_kind_of_str_and_int_is_written_as_marshal_writes_it_wherever_it_is(leaf) -> None:
    """A compact ASCII str is copied from the str, any other through its UTF-8 (one with a lone
    surrogate through marshal's writer); an int of one digit is read from the object, one of
    64 bits counted in 15-bit digits, a bigger one goes through marshal's writer: in every field,
    in a tuple, a list and a dict, as a key too, and in a mutation, the bytes marshal writes."""
    needs_native()
    calls = Calls()
    s = calls.sink()
    nest = (leaf, [leaf, (leaf,)], {leaf: leaf, "k": leaf})
    op = (leaf, leaf, leaf, leaf, leaf, None, leaf, leaf, nest, leaf)
    muts = [(1, 2, leaf, leaf, leaf, None, nest)]
    s(op, muts)
    assert calls.fallback == [] and s.take()[1] == marshal.dumps(compact(op, muts), 2)


def _nested(depth: int, leaf):
    for _ in range(depth):
        leaf = (leaf,) if depth % 2 else [leaf]
    return leaf


@pytest.mark.parametrize("depth", [61, 62, 63, 64, 65, 66, 90])
@pytest.mark.parametrize("leaf", [None, True, 7, 2**40, 2**70, "s", "é", {"k": 1}])
def test_values_nested_about_the_sinks_depth_limit_are_written_as_marshal_writes_them(
        depth: int, leaf) -> None:
    """Past the sink's depth limit the record goes to marshal's writer whole: on either side of
    it, the same bytes."""
    needs_native()
    calls = Calls()
    s = calls.sink()
    value = _nested(depth, leaf)
    op = op_tuple(1, attrs=(1, value))
    muts = [(1, 1, "k", 3, None, None, value)]
    s(op, muts)
    assert calls.fallback == [] and s.take()[1] == marshal.dumps(compact(op, muts), 2)


def test_the_parents_encoding_is_kept_only_for_the_tuple_it_was_made_from() -> None:
    """The sink keeps the bytes of the parent ids it wrote last, holding that tuple: a context
    that gives an equal tuple, another tuple (a trace id past 64 bits, strs), the same tuple
    with a list in it changed since, or (after ``forget_context``) a new tuple made where the
    freed one was, is written as marshal writes it at that record."""
    needs_native()
    shared = [2]
    parents = {"a": (1, 2, 1, False), "big": (2**100 + 7, 2**63 + 1, 1, True),
               "equal": tuple([1, 2, 1, False]), "strs": ("trace-é", "span", 0, None),
               "list": (1, shared, 0, False)}
    made = []

    def parent_of(ctx):
        if ctx == "fresh":  # a new tuple each lookup, the last one freed before
            made.append(len(made))
            return tuple([len(made), 10 * len(made), 0, False])
        return parents[ctx]

    s = sink_mod.Sink(print, print, parent_of)
    s.limit = 1 << 40
    want = []

    def record(ctx) -> None:
        op = op_tuple(len(want), ctx=ctx)
        muts = [(1, 1, "k", 3, None, None, len(want))]
        s(op, muts)
        parent = (len(made), 10 * len(made), 0, False) if ctx == "fresh" else parents[ctx]
        want.append(marshal.dumps((*op[:5], parent, *op[6:], muts), 2))

    for ctx in ("a", "a", "big", "big", "equal", "a", "strs", "strs", "list"):
        record(ctx)
    shared.append(3)  # the same tuple, its list changed
    record("list")
    for _ in range(4):
        record("fresh")
        s.forget_context()
    record("a")
    assert s.n == len(want) and s.take()[1] == b"".join(want)


def test_what_is_not_an_op_record_goes_back() -> None:
    needs_native()
    calls = Calls()
    s = calls.sink()
    bad = [((1, 2, 3), []), (op_tuple(1)[:9], []), (op_tuple(1), ()), (list(op_tuple(1)), [])]
    for op, muts in bad:
        s(op, muts)
    assert calls.fallback == [op for op, _ in bad] and s.n == 0 and s.nbytes == 0
    with pytest.raises(TypeError, match=r"takes \(op, mutations\)"):
        s(op_tuple(1))


def test_the_limit_sends_calls_to_full_and_the_buffer_empties_on_take() -> None:
    needs_native()
    calls = Calls()
    s = calls.sink(limit=2)
    for i in range(4):
        s(op_tuple(i), [])
    assert s.n == 2 and [op[0] for op in calls.full] == [2, 3] and s.recorded_seq == 3
    n, data = s.peek()
    assert (n, data) == s.take() and n == 2 and (s.n, s.nbytes) == (0, 0)
    assert decode(b"[" + n.to_bytes(4, "little") + data) == [compact(op_tuple(i), [])
                                                             for i in range(2)]
    s.limit = -5
    assert s.limit == 0
    s.limit = 1 << 80
    assert s.limit == sys.maxsize
    with pytest.raises(TypeError, match="limit must be an int"):
        s.limit = "3"
    with pytest.raises(TypeError, match="full=3 is not callable"):
        sink_mod.Sink(3, print, print)


def test_take_batch_hands_the_records_over_as_one_marshal_list_and_empties_the_buffer() -> None:
    needs_native()
    calls = Calls()
    s = calls.sink()
    assert s.take_batch() == (0, b"[" + bytes(4))  # nothing buffered: an empty list
    ops = [(op_tuple(i), [(i, i, "node.touch", i, None, None, i)]) for i in range(3)]
    for op, muts in ops:
        s(op, muts)
    peeked = s.peek()
    n, blob = s.take_batch()
    assert n == 3 and (s.n, s.nbytes) == (0, 0)
    assert blob == b"[" + n.to_bytes(4, "little") + peeked[1]  # what join_encoded makes
    assert decode(blob) == marshal.loads(blob) == [compact(op, m) for op, m in ops]
    s(op_tuple(9), [])
    assert decode(s.take_batch()[1]) == [compact(op_tuple(9), [])]


def test_take_batch_of_big_batches_swaps_buffers_and_loses_no_record() -> None:
    """Past 64 KB the sink writes on into its spare buffer while the batch is copied (with the
    GIL released): batch after batch, of growing and shrinking sizes, each whole and in order,
    and the records recorded after a take in the next batch."""
    needs_native()
    calls = Calls()
    s = calls.sink()
    i = 0
    for size in (2_000, 5_000, 300, 9_000, 2_000, 1, 4_000):
        ops = []
        for _ in range(size):
            ops.append((op_tuple(i), [(i, i, "node.create", i, None, None, (1, None, b"k" * 40))]))
            s(*ops[-1])
            i += 1
        n, blob = s.take_batch()
        assert n == size and (s.n, s.nbytes) == (0, 0)
        assert decode(blob) == [compact(op, m) for op, m in ops]


def test_after_a_burst_take_batch_swaps_between_two_buffers_of_at_most_16_mb() -> None:
    """A burst (the drain thread blocked while the cache recorded on) grows the buffer past
    16 MB. The buffer a take swaps to is no bigger than 16 MB and the burst's is not kept, so
    from the next take on the sink swaps between the same two buffers, whose pages stay mapped.
    It used to size each new buffer after the burst's and free the last: a new 32 MB buffer per
    take for the rest of the run, its pages faulted in anew by the cache's thread (issue 17)."""
    needs_native()
    calls = Calls()
    s = calls.sink()
    big = (1, None, b"k" * 4000)
    i = 0

    def record(k: int) -> None:
        nonlocal i
        for _ in range(k):
            s(op_tuple(i), [(i, i, "node.create", i, None, None, big)])
            i += 1

    record(5_000)  # ~20 MB: the burst
    assert s.capacity[0] > 1 << 24
    n, blob = s.take_batch()
    assert n == 5_000 and len(decode(blob)) == 5_000
    assert s.capacity[0] <= 1 << 24 and s.capacity[1] == 0  # the burst's buffer is given back
    seen = []
    for _ in range(4):
        record(200)  # ~800 KB: a normal batch
        first = i - 200
        n, blob = s.take_batch()
        assert n == 200 and [r[0] for r in decode(blob)] == list(range(first, i))
        seen.append(s.capacity)
    assert all(0 < c <= 1 << 24 for cap in seen for c in cap), seen
    assert len({tuple(sorted(cap)) for cap in seen}) == 1, seen  # the same two buffers


def test_the_parent_is_looked_up_once_per_context_and_a_failed_lookup_goes_back() -> None:
    needs_native()
    calls = Calls()
    s = calls.sink()
    a, b = object(), object()
    for ctx in (a, a, b, b, a, None):
        s(op_tuple(1, ctx=ctx), [])
    assert calls.contexts == [a, b, a, None]
    s.forget_context()
    s(op_tuple(1, ctx=None), [])
    assert calls.contexts == [a, b, a, None, None]
    bad = sink_mod.Sink(print, lambda op, m: calls.fallback.append(op), lambda ctx: "not ids")
    bad.limit = 10
    bad(op_tuple(7, ctx=a), [])
    assert calls.fallback == [op_tuple(7, ctx=a)] and bad.n == 0


def feed(rec: TelemetryRecorder, ops: list[tuple[tuple, list]]) -> None:
    for op, muts in ops:
        rec.record(op, list(muts))


def shipped(rec: TelemetryRecorder) -> list[tuple]:
    rec.seal()
    return [r for _, blob in rec.take(1 << 40) for r in decode(blob)]


def workload() -> list[tuple[tuple, list]]:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext

    ctx = trace.set_span_in_context(NonRecordingSpan(SpanContext(5, 6, False)))
    ops = []
    for i in range(40):
        attrs = (i, i * 3, "r", 0)
        if i % 13 == 5:
            attrs = {"at": datetime.date(2026, 1, 1 + i % 20)}  # marshal cannot: pickled
        muts = [(i, i, "node.create", i + 1, None, None, (0, None, array("Q", range(i * 7))))]
        ops.append((op_tuple(i, attrs, ctx=None if i < 20 else ctx), muts))
    return ops


@pytest.mark.parametrize("encode_batch", [1, 3, 7, 4096])
def test_a_recorder_on_the_sink_ships_what_one_on_the_python_encoder_ships(
        encode_batch: int) -> None:
    needs_native()
    got = {}
    for enc in ("native", "python"):
        rec = TelemetryRecorder(Health(), encode_batch=encode_batch, encoder=enc)
        feed(rec, workload()[:25])
        ops, _ = rec.tail()  # what is buffered, in order, before anything ships
        assert [o.op_id for o in ops] == list(range(25))
        feed(rec, workload()[25:])
        got[enc] = (shipped(rec), rec.recorded_seq, rec.health.snapshot()["dropped"])
    assert got["native"] == got["python"]
    records = got["native"][0]
    assert [r[0] for r in records] == list(range(40))
    assert records[5][8] == {"at": datetime.date(2026, 1, 6)}
    assert records[9][10][0][6][2] == array("Q", range(63)).tobytes()
    assert records[19][5] == (0, 0, 0, False) and records[20][5] == (5, 6, 0, False)


@pytest.mark.parametrize("encoder", ["native", "python"])
def test_the_cache_thread_wakes_the_drain_thread_for_a_batch_and_never_joins_one(
        encoder: str) -> None:
    """A batch due (``encode_batch`` records buffered) wakes the drain thread, at every
    multiple; the cache's thread queues nothing itself (a join of megabytes into fresh pages
    stalled one op for up to 12 ms), and what the drain thread seals later ships whole, in
    order."""
    if encoder == "native":
        needs_native()
    rec = TelemetryRecorder(Health(), encode_batch=4, encoder=encoder)
    feed(rec, workload()[:3])
    assert not rec.wake.is_set()
    feed(rec, workload()[3:5])
    assert rec.wake.is_set() and not rec.pending and rec.buffered() == 5
    rec.wake.clear()
    feed(rec, workload()[5:7])
    assert not rec.wake.is_set()
    feed(rec, workload()[7:9])
    assert rec.wake.is_set() and not rec.pending and rec.buffered() == 9
    assert [r[0] for r in shipped(rec)] == list(range(9))
    assert rec.health.snapshot()["dropped"][DROP_OP] == 0


@pytest.mark.parametrize("encoder", ["native", "python"])
def test_a_new_encode_batch_takes_effect_from_the_next_record(encoder: str) -> None:
    """``encode_batch`` set on a live recorder holds from the next record: the native sink's
    limit is set again at once (before, it kept waking the drain thread at the old size)."""
    if encoder == "native":
        needs_native()
    rec = TelemetryRecorder(Health(), encode_batch=100, encoder=encoder)
    feed(rec, workload()[:2])
    rec.encode_batch = 3
    feed(rec, workload()[2:4])  # the batch is due at the 3rd record (the sink: on the 4th)
    assert rec.wake.is_set() and rec.buffered() == 4
    rec.wake.clear()
    rec.encode_batch = 50
    feed(rec, workload()[4:9])
    assert not rec.wake.is_set()
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match=f"encode_batch={bad!r}"):
            rec.encode_batch = bad
    assert rec.encode_batch == 50
    assert [r[0] for r in shipped(rec)] == list(range(9))


@pytest.mark.parametrize("encoder", ["native", "python"])
def test_a_full_recorder_drops_and_counts_on_either_encoder(encoder: str) -> None:
    if encoder == "native":
        needs_native()
    rec = TelemetryRecorder(Health(), queue_capacity=3, overflow="drop", encode_batch=2,
                            encoder=encoder)
    feed(rec, workload()[:6])
    dropped = rec.health.snapshot()["dropped"]
    assert dropped[DROP_OP] == 3 and dropped[DROP_MUTATION] == 3
    assert [r[0] for r in shipped(rec)] == [0, 1, 2]
    assert rec.recorded_seq == 5
    feed(rec, workload()[6:8])  # room again after the take
    assert [r[0] for r in shipped(rec)] == [6, 7]
    rec.queue_capacity = 0  # what the pipeline's close does
    feed(rec, workload()[8:9])
    assert rec.health.snapshot()["dropped"][DROP_OP] == 4 and shipped(rec) == []


@pytest.mark.parametrize("encoder", ["native", "python"])
def test_records_ship_once_and_in_order_while_another_thread_seals_and_takes(
        encoder: str) -> None:
    """The drain thread's side (``seal``, ``take``) runs between any two of the cache thread's
    steps (a switch interval of 1 us); with a small batch, a capacity the writer keeps hitting
    (``overflow="block"``) and records the sink hands back (every 9th: a date attribute), every
    record still ships exactly once, in recording order, and nothing is dropped."""
    import threading

    if encoder == "native":
        needs_native()
    rec = TelemetryRecorder(Health(), queue_capacity=40, overflow="block", block_timeout_s=10,
                            encode_batch=7, encoder=encoder)
    got: list[int] = []
    done = threading.Event()

    def drain() -> None:
        while not done.is_set() or rec.buffered() or rec.pending:
            rec.seal()
            for _, blob in rec.take(13):
                got.extend(r[0] for r in decode(blob))

    n = 3000
    ops = [(op_tuple(i, {"at": datetime.date(2026, 1, 1)} if i % 9 == 4 else (i, "r")),
            [(i, i, "node.touch", i, None, None, i)]) for i in range(n)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=drain)
    t.start()
    try:
        feed(rec, ops)
    finally:
        done.set()
        t.join(60)
        sys.setswitchinterval(old)
    assert not t.is_alive()
    assert got == list(range(n))
    assert rec.health.snapshot()["dropped"][DROP_OP] == 0 and rec.recorded_seq == n - 1


def test_an_unknown_encoder_is_refused() -> None:
    with pytest.raises(ValueError, match="encoder='marshal'"):
        TelemetryRecorder(Health(), encoder="marshal")


def test_the_store_is_the_same_on_the_python_encoder() -> None:
    """Without the module (as on a machine with no C compiler) the recorder's and the store's
    tests pass unchanged."""
    pass_without_native(["tests/telemetry/test_telemetry_store.py",
                         "tests/telemetry/test_telemetry_spans.py",
                         "tests/telemetry/test_telemetry_concurrency.py",
                         "tests/telemetry/test_sink.py::test_a_full_recorder_drops_and_counts_on_either_encoder"])
