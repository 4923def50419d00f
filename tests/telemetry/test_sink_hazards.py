"""The recorder's encoder where Python code runs in the middle of a record, or between the cache's
thread and the drain thread's: each test is a review finding that crashed, lost or reordered
records before its fix. Python code can run mid-record because marshal's writer sorts a set's
items, which allocates and so may run a collection, and with it finalizers (a ``__del__`` on a
cycle stands in for any other thread taking the GIL there), and from Python 3.12 because the
encoders ask a buffer for its bytes, which a Python class's ``__buffer__`` gives. A collection
runs mid-call only before 3.12 (``tests/kits/finalizers.py``): a test that needs Python code
mid-record runs it each way (``trigger``), by a finalizer before 3.12, by a buffer from 3.12."""

from __future__ import annotations

import datetime
import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from radixscope.telemetry.record import sink as sink_mod
from radixscope.telemetry.record.drops import DROP_OP, Health
from radixscope.telemetry.record.encode import Chunk, decode, part_records
from radixscope.telemetry.record.recorder import TelemetryRecorder
from tests.kits.finalizers import MID_CALL, BufferRuns, finalizer_runs, mid_call_gc
from tests.kits.require import missing

SORTS = (frozenset(range(50)),)  # attrs whose encoding allocates: a collection can run there
ENCODERS = ["native", "python"]


@contextmanager
def mid_record(trigger: str, action: Callable[[], None]) -> Iterator[tuple]:
    """Attrs whose encoding runs ``action`` mid-record: ``SORTS``, a finalizer running it at the
    collection their sort makes (before Python 3.12), or a ``BufferRuns`` (from 3.12)."""
    if trigger == "collection":
        with finalizer_runs(action):
            yield SORTS
    else:
        yield (BufferRuns(action),)


def written(trigger: str) -> tuple:
    """The attrs ``mid_record`` gave, as they read back."""
    return SORTS if trigger == "collection" else (BufferRuns.DATA,)


def needs(encoder: str) -> None:
    if encoder == "native" and sink_mod.Sink is None:
        missing("native", "the native encoder was not built (no C compiler at install, or "
                "RADIXSCOPE_NATIVE=0)")


def op(i: int, attrs=(1,), ctx=None) -> tuple:
    return (i, "insert", 0, 0, "r", ctx, i, i, attrs, None)


def sink(fallback: list | None = None, parent_of=lambda ctx: (0, 0, 0, False)):
    needs("native")
    s = sink_mod.Sink(lambda o, m: None,
                      lambda o, m: fallback.append(o[0]) if fallback is not None else None,
                      parent_of)
    s.limit = 100
    return s


@pytest.mark.parametrize("trigger", MID_CALL)
def test_a_take_mid_record_gets_the_whole_records_and_the_half_one_completes_after(
        trigger: str) -> None:
    s = sink()
    s(op(0), [])
    seen = []
    with mid_record(trigger, lambda: seen.append(s.take())) as attrs:
        s(op(1, attrs), [])
    assert [n for n, _ in seen] == [1] and part_records(Chunk(*seen[0]))[0][0] == 0
    n, data = s.take()
    assert n == 1 and [r[0] for r in part_records(Chunk(n, data))] == [1]


@pytest.mark.parametrize("trigger", MID_CALL)
@pytest.mark.parametrize("before", [1, 2_000], ids=["in place", "buffers swapped"])
def test_a_take_batch_mid_record_gets_the_whole_records_and_the_half_one_completes_after(
        before: int, trigger: str) -> None:
    s = sink()
    s.limit = 1 << 40
    for i in range(before):
        s(op(i, ("x" * 40,)), [])
    seen = []
    with mid_record(trigger, lambda: seen.append(s.take_batch())) as attrs:
        s(op(before, attrs), [])
    assert [n for n, _ in seen] == [before]
    assert [r[0] for r in decode(seen[0][1])] == list(range(before))
    n, blob = s.take_batch()
    assert n == 1 and [(r[0], r[8]) for r in decode(blob)] == [(before, written(trigger))]


@pytest.mark.parametrize("trigger", MID_CALL)
def test_a_list_emptied_mid_record_is_handed_back_not_read_freed(trigger: str) -> None:
    back: list = []
    s = sink(back)
    muts: list = [str(i) * 50 for i in range(20)]
    with mid_record(trigger, muts.clear) as attrs:
        muts.insert(0, attrs[0])
        s(op(1), muts)
    assert back == [1] and (s.n, s.nbytes) == (0, 0)


@mid_call_gc  # (from 3.12 no Python code can run there: nothing to test)
def test_a_dict_a_collection_changes_while_it_is_written_is_read_whole() -> None:
    """A lone surrogate's failed UTF-8 allocates an exception, so a collection can run there
    and change the dict: the sink writes a dict natively only when nothing can, else marshal
    writes it whole (before: a value read freed, one the dict never held)."""
    d = {"\ud800": int("7" * 200), "k": None}
    ran = []

    class Cycle:
        def __del__(self) -> None:
            ran.append(1)
            d["\ud800"] = 0  # frees the big int
            junk = [int("8" * 200) for _ in range(50)]  # takes its memory
            del junk

    s = sink()
    rec, muts = op(1, (d, d)), []
    gc.collect()
    old = gc.get_threshold()
    c = Cycle()
    c.me = c
    gc.set_threshold(1)  # the next allocation the collector counts collects: inside the record
    try:
        del c
        s(rec, muts)
    finally:
        gc.set_threshold(*old)
    n, data = s.take()
    assert ran and part_records(Chunk(n, data))[0][8] == (d, d) == ({"\ud800": 0, "k": None},) * 2


def test_the_remembered_parent_replaced_mid_lookup_is_not_read_freed() -> None:
    class Forget:
        def __del__(self) -> None:
            s.forget_context()

    def parent_of(ctx):
        return (Forget(), 0, 0, False) if ctx == "a" else (int("123456789012"), 2, 1, False)

    back: list = []
    s = sink(back, parent_of)
    s(op(1, ctx="a"), [])  # its parent cannot be encoded: handed back, remembered
    s(op(2, ctx="b"), [])  # replacing it runs Forget.__del__
    n, data = s.take()
    assert back == [1] and part_records(Chunk(n, data))[0][5] == (123456789012, 2, 1, False)


def test_a_callbacks_error_reaches_the_caller_whatever_seq_last_is() -> None:
    def boom(o, m):
        raise KeyError("from fallback")

    needs("native")
    s = sink_mod.Sink(boom, boom, lambda c: (0, 0, 0, False))
    for seq_last in (5, -1):
        with pytest.raises(KeyError, match="from fallback"):
            s((1, "x", 0, 0, None, None, 0, seq_last, (), None), ())


def test_a_sink_never_initialised_refuses_calls() -> None:
    needs("native")
    s = sink_mod.Sink.__new__(sink_mod.Sink)
    with pytest.raises(RuntimeError, match="not initialised"):
        s(op(1), [])


@pytest.mark.parametrize("trigger", MID_CALL)
@pytest.mark.parametrize("encoder", ENCODERS)
def test_a_seal_mid_record_loses_nothing(encoder: str, trigger: str) -> None:
    needs(encoder)
    rec = TelemetryRecorder(Health(), encode_batch=100, encoder=encoder)
    rec.record(op(0), [])
    rec.record(op(1, {"d": datetime.date(2026, 1, 1)}), [])  # handed back: the Python path
    rec.record(op(2), [])
    with mid_record(trigger, rec.seal) as attrs:
        rec.record(op(3, attrs), [])
    rec.seal()
    assert [r[0] for _, b in rec.take(1 << 30) for r in decode(b)] == [0, 1, 2, 3]
    assert rec.health.snapshot()["dropped"][DROP_OP] == 0


def test_a_seal_between_a_hand_back_and_its_append_keeps_the_order() -> None:
    """The drain thread seals after the cache's thread moved the sink's buffer aside for a
    handed-back record and before it appended that record; the cache's thread then records
    one more into the sink."""
    needs("native")
    at_append, in_seal, cache_done = threading.Event(), threading.Event(), threading.Event()

    class Parts(list):
        def append(self, x) -> None:  # the cache's thread, in _fallback, after _move_sink
            if threading.current_thread() is cache:
                at_append.set()
                in_seal.wait(5)
            super().append(x)

        def __getitem__(self, i):  # the drain thread, in seal
            if isinstance(i, slice) and threading.current_thread() is not cache:
                in_seal.set()
                cache_done.wait(5)
            return super().__getitem__(i)

    rec = TelemetryRecorder(Health(), encoder="native", encode_batch=100)
    rec._parts = Parts()

    def cache_thread() -> None:
        rec.record(op(0), [])
        rec.record(op(1, {"d": datetime.date(2026, 1, 1)}), [])
        rec.record(op(2), [])
        cache_done.set()

    cache = threading.Thread(target=cache_thread)
    cache.start()
    at_append.wait(5)
    rec.seal()
    cache.join()
    rec.seal()
    assert [r[0] for _, b in rec.take(1 << 30) for r in decode(b)] == [0, 1, 2]


@pytest.mark.parametrize("encoder", ENCODERS)
def test_a_blocked_record_sees_the_room_a_drain_made_before_it_waited(encoder: str) -> None:
    needs(encoder)
    rec = TelemetryRecorder(Health(), queue_capacity=2, overflow="block", block_timeout_s=5.0,
                            encode_batch=1, encoder=encoder)

    class Wake(threading.Event):
        armed = False  # (the wakes of the batches due before the queue is full: no drain)

        def set(self) -> None:  # the drain thread runs right here, before the wait
            super().set()
            if self.armed:
                rec.seal()
                rec.take(1 << 30)

    rec.wake = Wake()
    rec.record(op(0), [])
    rec.record(op(1), [])  # the queue is full
    rec.wake.armed = True
    t0 = time.monotonic()
    rec.record(op(2), [])
    assert time.monotonic() - t0 < 2.5
    assert rec.health.snapshot()["dropped"][DROP_OP] == 0 and rec.buffered() == 1


@pytest.mark.parametrize("encoder", ENCODERS)
def test_a_hand_back_counts_against_the_capacity(encoder: str) -> None:
    needs(encoder)
    rec = TelemetryRecorder(Health(), queue_capacity=3, overflow="drop", encode_batch=100,
                            encoder=encoder)
    rec.record(op(0, {"d": datetime.date(2026, 1, 1)}), [])
    for i in range(1, 6):
        rec.record(op(i), [])
    assert rec.buffered() == 3 and rec.health.snapshot()["dropped"][DROP_OP] == 3


@pytest.mark.parametrize("encoder", ENCODERS)
def test_a_record_nested_to_marshals_limit_ships_and_reads_back(encoder: str) -> None:
    needs(encoder)
    deep = 0
    for _ in range(1998):  # marshal writes it alone, and refuses it one level deeper
        deep = [deep]
    rec = TelemetryRecorder(Health(), encoder=encoder)
    rec.record(op(0), [])
    rec.record(op(1, deep), [])
    rec.seal()
    records = [r for _, b in rec.take(1 << 30) for r in decode(b)]
    assert [r[0] for r in records] == [0, 1]
    got, depth = records[1][8], 0
    while got != 0:
        got, depth = got[0], depth + 1
    assert depth == 1998
