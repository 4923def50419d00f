"""Spans: one per cache op, with exact names, attributes, parents and links.

The scripted scenario: a key is cached, backed up to host and evicted from device; then one
request matches it (host hit), loads it back, locks it, allocates and inserts two more tokens,
unlocks, polls the transfers and evicts.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.events import OpRecord
from radixscope.telemetry import names as n
from radixscope.telemetry.record.encode import CompactOp
from radixscope.telemetry.sinks.spans import DirectSpans, span_attributes
from tests.kits.cachekit import Driver, make_config
from tests.kits.telkit import Rig

ROOT = Path(__file__).resolve().parents[2]
Pair = collections.namedtuple("Pair", "a b")  # module level: picklable by reference

A = [1, 2, 3, 4, 5, 6, 7, 8]


def _scenario(rig: Rig):
    c = rig.cache
    Driver(c).insert(A, req_id="warm")
    c.poll()
    c.evict(8)
    rig.spans()  # drop the warm-up spans
    with rig.tracer.start_as_current_span("request") as req:
        m = c.match_prefix(A + [9, 10], req_id="r1")
        lb = c.load_back(m, req_id="r1")
        rec = c.lock(lb.anchor, owner="r1", req_id="r1")
        new = c.alloc(2, req_id="r1")
        c.insert(A + [9, 10], torch.cat([lb.device_indices, new]),
                 prev_prefix_len=lb.device_prefix_len, req_id="r1")
        c.unlock(rec, req_id="r1")
        c.poll()
        c.evict(4, req_id="r1")
    return req


def test_scripted_scenario_exact_span_sequence_and_attributes(tmp_path):
    rig = Rig(tmp_path, device_tokens=16, host_tokens=32)
    req = _scenario(rig)
    spans = rig.cache_spans()
    assert [s.name for s in spans] == [
        n.SPAN_MATCH, n.SPAN_LOAD_BACK, n.SPAN_LOCK, n.SPAN_ALLOC, n.SPAN_INSERT, n.SPAN_UNLOCK,
        n.SPAN_TRANSFER, n.SPAN_TRANSFER, n.SPAN_EVICT]
    attrs = [dict(s.attributes) for s in spans]
    common = [(a[n.ATTR_OP_ID], a[n.ATTR_SEQ], a[n.ATTR_OP_MUTATIONS]) for a in attrs]
    assert common == [(8, 17, 1), (9, 24, 7), (10, 25, 1), (11, 26, 1), (12, 34, 8), (13, 35, 1),
                      (14, 38, 3), (15, 41, 3), (16, 45, 4)]
    assert attrs[0] == {
        n.ATTR_OP_ID: 8, n.ATTR_SEQ: 17, n.ATTR_OP_MUTATIONS: 1, n.ATTR_REQUEST_ID: "r1",
        n.ATTR_KEY_TOKENS: 10, n.ATTR_MATCH_DEVICE_TOKENS: 0, n.ATTR_MATCH_HOST_TOKENS: 8,
        n.ATTR_MATCH_SWA_HOST_TOKENS: 0, n.ATTR_MATCH_MAMBA_HOST_STATES: 0, n.ATTR_NODE_ID: 0,
        n.ATTR_MATCH_BEST_NODE_ID: 1}
    assert attrs[1] == {
        n.ATTR_OP_ID: 9, n.ATTR_SEQ: 24, n.ATTR_OP_MUTATIONS: 7, n.ATTR_REQUEST_ID: "r1",
        n.ATTR_NODE_ID: 1, n.ATTR_TRANSFER_ID: 2, n.ATTR_TOKENS: 8,
        f"{n.ATTR_LOAD_BACK_LOADED_PREFIX}.full": 8}
    assert attrs[2] == {
        n.ATTR_OP_ID: 10, n.ATTR_SEQ: 25, n.ATTR_OP_MUTATIONS: 1, n.ATTR_REQUEST_ID: "r1",
        n.ATTR_LOCK_RECEIPT_ID: 7, n.ATTR_NODE_ID: 1, n.ATTR_LOCK_OWNER: "r1",
        n.ATTR_NODE_COUNT: 0}
    assert attrs[3][n.ATTR_COMPONENT] == "full" and attrs[3][n.ATTR_TOKENS] == 2
    assert {k: attrs[4][k] for k in (n.ATTR_KEY_TOKENS, n.ATTR_INSERT_PREFIX_TOKENS,
                                     n.ATTR_INSERT_NEW_TOKENS, n.ATTR_NODE_ID)} == {
        n.ATTR_KEY_TOKENS: 10, n.ATTR_INSERT_PREFIX_TOKENS: 8, n.ATTR_INSERT_NEW_TOKENS: 2,
        n.ATTR_NODE_ID: 2}
    assert attrs[5][n.ATTR_LOCK_RECEIPT_ID] == 7
    assert attrs[6] == {
        n.ATTR_OP_ID: 14, n.ATTR_SEQ: 38, n.ATTR_OP_MUTATIONS: 3, n.ATTR_TRANSFER_ID: 2,
        n.ATTR_TRANSFER_KIND: "load_back", n.ATTR_NODE_ID: 1, n.ATTR_TRANSFER_ENQUEUED_BY: 9,
        n.ATTR_BYTES: 512, n.ATTR_TOKENS: 8, f"{n.ATTR_TRANSFER_SLOTS_PREFIX}.full": 8,
        n.ATTR_NODE_COUNT: 1}
    assert attrs[7][n.ATTR_TRANSFER_KIND] == "backup"
    assert attrs[7][n.ATTR_TRANSFER_ENQUEUED_BY] == 12  # the insert's write-through backup
    assert attrs[8] == {
        n.ATTR_OP_ID: 16, n.ATTR_SEQ: 45, n.ATTR_OP_MUTATIONS: 4, n.ATTR_REQUEST_ID: "r1",
        n.ATTR_COMPONENT: "full", n.ATTR_REQUESTED_TOKENS: 4, n.ATTR_EVICT_FREED_TOKENS: 10,
        f"{n.ATTR_EVICT_FREED_PREFIX}.full": 10, n.ATTR_NODE_COUNT: 2}
    # parenting: every synchronous op is a child of the caller's request span
    req_ctx = req.get_span_context()
    for s in spans:
        if s.name != n.SPAN_TRANSFER:
            assert s.parent.span_id == req_ctx.span_id
            assert s.context.trace_id == req_ctx.trace_id
        assert s.kind == trace.SpanKind.INTERNAL
        assert s.start_time <= s.end_time
    rig.close()


def test_transfers_are_linked_not_children(tmp_path):
    rig = Rig(tmp_path, device_tokens=16, host_tokens=32)
    _scenario(rig)
    spans = rig.cache_spans()
    by_op = {s.attributes[n.ATTR_OP_ID]: s for s in spans}
    load_back, insert = by_op[9], by_op[12]
    for tr, enq in ((by_op[14], load_back), (by_op[15], insert)):
        assert tr.parent is None  # not a child of the enqueuing op (nor of the request)
        assert len(tr.links) == 1
        link = tr.links[0]
        assert link.context.span_id == enq.context.span_id
        assert link.context.trace_id == enq.context.trace_id
        assert dict(link.attributes) == {n.LINK_ATTR_OP_ID: enq.attributes[n.ATTR_OP_ID]}
    rig.close()


def test_store_renders_the_same_spans_with_parents_and_links(tmp_path):
    rig = Rig(tmp_path, device_tokens=16, host_tokens=32)
    req = _scenario(rig)
    sdk = {s.attributes[n.ATTR_OP_ID]: s for s in rig.cache_spans()}
    rig.close()
    with telemetry.open_store(rig.store_path) as r:
        df = r.spans()
    cache = df[df["scope"] == n.INSTRUMENTATION_SCOPE].set_index("op_id")
    for op_id, s in sdk.items():
        row = cache.loc[op_id]
        assert row["name"] == s.name
        assert row["span_id"] == format(s.context.span_id, "016x")
        assert row["trace_id"] == format(s.context.trace_id, "032x")
        assert row["attributes"] == dict(s.attributes)
        assert row["start_ns"] == s.start_time and row["end_ns"] == s.end_time
        want_links = [[format(lk.context.trace_id, "032x"), format(lk.context.span_id, "016x"),
                       dict(lk.attributes)] for lk in s.links]
        assert row["links"] == want_links
    # the caller's own span (a host span) is in the store too, and parents the ops
    host = df[df["name"] == "request"]
    assert list(host["span_id"]) == [format(req.get_span_context().span_id, "016x")]
    assert set(cache.loc[[8, 9, 16], "parent_span_id"]) == {host["span_id"].iloc[0]}


def test_direct_builder_matches_the_tracer_path():
    op = CompactOp(7, ev.OP_EVICT, 100, 250, "r9", 0xABC, 0xDEF, 1, False, 3, 6,
                   {ev.A_COMPONENT: "full", ev.A_FREED: {"full": 4, "swa": 2}}, None)
    from opentelemetry.sdk.resources import Resource

    d = DirectSpans(Resource.create({}), export=True, seed=1)
    tid, sid, pid = d.build(op)
    (span,) = d.take()
    assert span.name == n.SPAN_EVICT
    assert dict(span.attributes) == span_attributes(op) == {
        n.ATTR_OP_ID: 7, n.ATTR_SEQ: 6, n.ATTR_OP_MUTATIONS: 4, n.ATTR_REQUEST_ID: "r9",
        n.ATTR_COMPONENT: "full", f"{n.ATTR_EVICT_FREED_PREFIX}.full": 4,
        f"{n.ATTR_EVICT_FREED_PREFIX}.swa": 2}
    assert span.parent.span_id == 0xDEF and span.context.trace_id == 0xABC
    assert (tid, pid) == (format(0xABC, "032x"), format(0xDEF, "016x"))
    assert sid == format(span.context.span_id, "016x")
    assert (span.start_time, span.end_time) == (100, 250)
    # an unsampled parent: no span, no ids
    assert d.build(op._replace(parent_flags=0)) == (None, None, None)


def test_an_op_that_raised_gets_an_error_status(tmp_path):
    rig = Rig(tmp_path, device_tokens=8, host_tokens=16)
    c = rig.cache
    rec = c.lock(Driver(c).insert([1, 2, 3, 4, 5, 6, 7, 8]).last_node, owner="x")
    with pytest.raises(Exception, match="CacheOutOfMemory|out of memory|cannot"):
        c.alloc(8, req_id="r2")
    span = rig.cache_spans()[-1]
    assert span.name == n.SPAN_ALLOC
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.attributes[n.ATTR_ERROR_TYPE] == "CacheOutOfMemory"
    c.unlock(rec)
    rig.close()


def test_no_sdk_path_records_zero_spans_and_the_cache_works(tmp_path):
    tel = telemetry.setup(store=tmp_path / "s.db", mode="inline",
                          tracer_provider=trace.NoOpTracerProvider(), metrics=False,
                          capture_host_spans=False)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(c).insert([1, 2, 3, 4])
    c.poll()
    stats = tel.close()
    assert stats["failures"] == {}
    with telemetry.open_store(tmp_path / "s.db") as r:
        assert list(r.ops()["op"]) == ["match", "lock", "alloc", "insert", "unlock", "transfer"]
        assert r.ops()["span_id"].isna().all()
        assert r.spans().empty
        assert r.state_at(r.last_seq()) == c.snapshot()


class RaisingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        raise RuntimeError("collector on fire")

    def shutdown(self) -> None:
        return None


def test_a_raising_exporter_leaves_the_cache_working_and_counts_failures(tmp_path):
    exp = RaisingExporter()
    tel = telemetry.setup(store=tmp_path / "s.db", mode="inline", span_exporters=[exp],
                          metrics=False, capture_host_spans=False)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    for i in range(3):
        Driver(c).insert([1, 2, 3, i])
    c.poll()
    c.check()
    stats = tel.close()
    assert exp.calls >= 1
    assert stats["failures"]["exporter.RaisingExporter"] == exp.calls
    assert stats["dropped"]["span"] == 18  # 3 x (match, lock, alloc, insert, unlock, transfer)
    with telemetry.open_store(tmp_path / "s.db") as r:  # the store is unaffected
        assert len(r.ops()) == 18
        assert r.state_at(r.last_seq()) == c.snapshot()


def test_record_never_raises_and_counts_its_failures():
    tel = telemetry.setup(store=None, mode="inline", metrics=False, spans=False,
                          capture_host_spans=False)
    rec = tel.recorder

    class Evil(list):  # cannot be pickled, iterated or measured
        def __len__(self):
            raise RuntimeError("no")

        def __iter__(self):
            raise RuntimeError("no")

    rec.record(OpRecord(1, "match", 0, 1, None, None, 1, 0, {}, None), [])
    rec.record(OpRecord(2, "match", 0, 1, None, None, 1, 0, {}, None), Evil())  # unpicklable
    rec.record(OpRecord(3, "match", 0, 1, None, None, 1, 0, {}, None), [])
    tel.flush()  # the encode buffer is encoded: only the bad record is lost, and counted
    assert tel.stats()["failures"] == {"record.encode": 1}
    assert tel.stats()["dropped"] == {"op": 1, "mutation": 0, "span": 0, "event": 0}
    assert [o.op_id for o in rec.tail()[0]] == [1, 3]
    rec.record(None, [])  # not even a record: counted where it happens
    assert tel.stats()["failures"]["record"] == 1
    rec.queue_capacity = 0  # the overflow path counts what it drops, even here
    rec.overflow = "drop"
    rec.record(OpRecord(4, "match", 0, 1, None, None, 1, 0, {}, None), Evil())
    assert tel.stats()["dropped"]["op"] == 3
    tel.close()


class OkExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def test_extra_exporters_receive_batched_spans(tmp_path):
    exp = OkExporter()
    tel = telemetry.setup(store=None, mode="inline", span_exporters=[exp], metrics=False,
                          capture_host_spans=False)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(c).insert([5, 6, 7])
    tel.flush()
    assert [s.name for s in exp.spans] == [n.SPAN_MATCH, n.SPAN_LOCK, n.SPAN_ALLOC,
                                           n.SPAN_INSERT, n.SPAN_UNLOCK]
    tel.close()


def test_encoded_records_round_trip_with_parent_ids():
    import pickle

    from opentelemetry import context as otel_context
    from opentelemetry.sdk.trace import TracerProvider

    from radixscope.telemetry.record.encode import compact_record, decode_records, encode_batch

    def encode_record(op, muts, last):  # one record as its own batch, nothing lost
        blob, lost = encode_batch([compact_record(op, muts, last)])
        assert lost == []
        return blob

    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("a") as a:
        ctx_a1 = otel_context.get_current()
        ctx_a2 = otel_context.set_value("other", 1)  # another Context object, same span
    invalid = trace.set_span_in_context(trace.INVALID_SPAN)
    last = [(None, (0, 0, 0, False))]
    blobs = [encode_record(OpRecord(i, "match", 10 * i, 10 * i + 5, None, ctx, i, i - 1,
                                    {"key_tokens": i} if i != 3 else None, None), muts, last)
             for i, (ctx, muts) in enumerate([(ctx_a1, [(1, 0, "node.touch", 2, None, None, 7)]),
                                              (ctx_a2, []), (None, []), (invalid, []),
                                              (otel_context.Context(), [])])]
    assert all(type(b) is bytes for b in blobs)  # untracked by the garbage collector
    ops, muts = decode_records(pickle.loads(pickle.dumps(blobs)))
    sc = a.get_span_context()
    assert [(o.parent_trace_id, o.parent_span_id) for o in ops] == [
        (sc.trace_id, sc.span_id), (sc.trace_id, sc.span_id), (0, 0), (0, 0), (0, 0)]
    assert ops[0].parent_flags & 1 and ops[3].attrs == {}  # sampled; None attrs -> {}
    assert [o.op_id for o in ops] == [0, 1, 2, 3, 4]
    assert muts == [(1, 0, "node.touch", 2, None, None, 7)]
    # an attribute pickle cannot take is kept as text instead of losing the record
    odd = encode_record(OpRecord(9, "insert", 0, 1, None, None, 1, 0, {"x": lambda: 0}, None),
                        [(1, 9, "node.create", 3, None, None, (0, threading_lock(), (1, 2)))],
                        last)
    (op,), (m,) = decode_records([odd])
    assert op.attrs["x"].startswith("<function") and m[6][2] == (1, 2)
    # one marshal cannot encode (a tuple subclass) goes through pickle, unchanged
    pair = Pair(1, 2)
    (op,), _ = decode_records([encode_record(
        OpRecord(10, "evict", 0, 1, None, None, 1, 0, {"p": pair}, None), [], last)])
    assert op.attrs == {"p": pair} and type(op.attrs["p"]) is Pair


def test_the_writer_imports_neither_torch_nor_pandas():
    """The writer process starts from ``telemetry.sinks.writer_process``: keeping torch (the cache's) and
    pandas (the reader's) out of it makes telemetry.setup start in a fraction of a second."""
    code = ("import sys, radixscope.telemetry.sinks.writer_process; "
            "print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def threading_lock():
    import threading

    return threading.Lock()


def test_the_flight_ring_keeps_its_records_however_they_were_batched():
    """Records ship in encoded batches of up to 64, or fewer when a drain comes first; the ring
    still keeps at least ``flight_ring`` of the latest records, and ``tail`` returns them in
    order, the buffered ones included."""
    tel = telemetry.setup(store=None, mode="inline", metrics=False, spans=False,
                          capture_host_spans=False, flight_ring=50, drain_interval_s=60.0)
    c = HiRadixCache(make_config(device_tokens=512, host_tokens=1024), recorder=tel.recorder)
    d = Driver(c)
    for i in range(40):
        d.insert([i, i + 1, i + 2])  # 5 ops
        c.poll()  # + the write-through backup's transfer record
        if i % 3:
            tel.flush()  # small batches: 6 or 12 records each
    ops, _ = tel.recorder.tail()
    ids = [o.op_id for o in ops]
    assert len(ids) >= 50 and ids == list(range(ids[0], c._op_id + 1))
    assert [o.op_id for o in tel.recorder.tail(7)[0]] == list(range(c._op_id - 6, c._op_id + 1))
    tel.close()


def test_records_encoded_one_by_one_join_into_the_batch_blob():
    """The recorder encodes each record as its op ends (``encode_one``, or the native sink's
    ``Chunk`` of several) and joins a batch's parts (``join_encoded``): the blob is byte for
    byte ``encode_batch``'s, and a record marshal cannot take (a date attribute) sends the batch
    down ``encode_batch``'s pickle path."""
    import datetime

    from radixscope.telemetry.record.encode import (
        Chunk,
        decode,
        encode_batch,
        encode_one,
        join_encoded,
        part_records,
    )

    recs = [(i, "insert", 10 * i, 10 * i + 5, f"r{i}", (0, 0, 0, False), i, i,
             {"key_tokens": i, "freed": {"full": 3}}, None,
             [(i, i, "node.create", i + 1, None, None, (0, None, tuple(range(i * 50))))])
            for i in range(5)]
    parts = [encode_one(r) for r in recs]
    assert all(type(p) is bytes for p in parts)
    blob, lost = join_encoded(parts)
    assert lost == [] and blob == encode_batch(recs)[0] and decode(blob) == recs
    chunked = [parts[0], Chunk(3, b"".join(parts[1:4])), parts[4]]
    assert part_records(chunked[1]) == recs[1:4]
    assert join_encoded(chunked) == (blob, [])
    odd = recs[:2] + [(*recs[2][:8], {"at": datetime.date(2026, 1, 1)}, None, [])]
    parts = [encode_one(r) for r in odd]
    assert type(parts[2]) is tuple and part_records(parts[0]) == [odd[0]]
    blob, lost = join_encoded(parts)
    assert lost == [] and blob[0] == 0x80 and decode(blob) == odd
    blob, lost = join_encoded([Chunk(2, parts[0] + parts[1]), parts[2]])
    assert lost == [] and blob[0] == 0x80 and decode(blob) == odd
