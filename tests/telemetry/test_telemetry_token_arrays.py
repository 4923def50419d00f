"""A created node's tokens travel as the node's own key (``array('Q')``, issue 17's hot path):
the cache hands the array itself, marshal ships its buffer as bytes, and every consumer gets
tokens again: the writer's replica and store (``node_tokens``, which the journal's count
refers to, keyframes, ``state_at``), the flight-recorder tail, crash windows and the in-process ``FlightRecorder``."""

from __future__ import annotations

import json
import sqlite3
from array import array

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.events import FlightRecorder
from radixscope.cache.keys import KEY_TYPECODE
from radixscope.telemetry.record import encode
from radixscope.telemetry.store.keyframes import pack_tokens, unpack_tokens
from radixscope.telemetry.store.reader import open_store
from tests.kits.cachekit import make_config

BIG = 2**40  # a token id past uint32: node_tokens keeps it as uint64


def _fill(c: HiRadixCache) -> None:
    for key in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9], [7, BIG, 8]):
        idx = c.alloc(len(key))
        c.insert(key, idx, req_id="r")


def _creates(muts) -> dict[int, tuple]:
    return {m[3]: m[6] for m in muts if m[2] == ev.NODE_CREATE}


def test_the_token_code_the_decoder_uses_is_the_cache_s_key_code():
    assert encode._TOKEN_CODE == KEY_TYPECODE


def test_node_create_carries_the_node_key_itself_and_it_is_never_changed_by_a_split():
    rec = FlightRecorder()
    c = HiRadixCache(make_config(("full",), device_tokens=64, host_tokens=0), recorder=rec)
    idx = c.alloc(6)
    c.insert([1, 2, 3, 4, 5, 6], idx, req_id="r")
    (nid, (parent, extra, toks)), = _creates(rec.mutations).items()
    assert (parent, extra) == (0, None)
    assert toks is c.tree.nodes[nid].key  # no copy on the hot path
    assert type(toks) is array and toks.typecode == KEY_TYPECODE
    c.insert([1, 2, 3, 9, 9], c.alloc(5), req_id="r")  # splits node nid after 3 tokens
    assert c.tree.nodes[nid].key.tolist() == [4, 5, 6]
    assert toks.tolist() == [1, 2, 3, 4, 5, 6]  # the recorded array kept its tokens


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_every_consumer_of_a_shipped_node_create_gets_its_tokens(tmp_path, mode):
    store = tmp_path / "s.db"
    tel = telemetry.setup(store=store, mode=mode, metrics=False, capture_host_spans=False,
                          keyframe_every=3)
    c = HiRadixCache(make_config(("full",), device_tokens=64, host_tokens=0),
                     recorder=tel.recorder)
    _fill(c)
    tel.flush()
    _ops, muts = tel.recorder.tail()  # the flight-recorder ring: encoded, decoded here
    tail = _creates(muts)
    assert [v[2].tolist() for v in tail.values()] == [[1, 2, 3, 4, 5, 6], [9, 9], [7, BIG, 8]]
    assert all(type(v[2]) is array for v in tail.values())
    snap = c.snapshot()
    tel.close()
    with open_store(store) as r:
        stored = _creates(r.journal())
        assert {n: list(v[2]) for n, v in stored.items()} == \
            {n: v[2].tolist() for n, v in tail.items()}
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        chunks = [json.loads(row[0]) for row in con.execute("SELECT data FROM journal")]
        blobs = dict(con.execute("SELECT node, tokens FROM node_tokens"))
    finally:
        con.close()
    # each token stored once (schema 5): the journal names the count, node_tokens the tokens
    assert [m[6][2] for ch in chunks for m in ch if m[2] == ev.NODE_CREATE] == [6, 2, 3]
    assert {n: unpack_tokens(b).tolist() for n, b in blobs.items()
            if n in tail} == {n: v[2].tolist() for n, v in tail.items()}
    with open_store(store) as r:
        assert r.state_at(snap.seq) == snap  # keyframes (token references) and replay


def test_pack_tokens_of_an_array_equals_pack_tokens_of_its_ints():
    for toks in ([], [0, 1, 2**32 - 1], [3, 2**32], [BIG, 1]):
        a = array(KEY_TYPECODE, toks)
        assert pack_tokens(a) == pack_tokens(list(toks))
        assert unpack_tokens(pack_tokens(a)).tolist() == toks


def test_json_dumps_writes_an_array_as_its_list():
    assert encode.dumps([1, array(KEY_TYPECODE, [5, 6])]) == "[1,[5,6]]"


def test_decoding_leaves_arrays_and_other_mutations_as_they_are():
    toks = array(KEY_TYPECODE, [4, 5])
    kept = [(1, 1, ev.NODE_CREATE, 1, None, None, (0, None, toks)),
            (2, 1, ev.NODE_TOUCH, 1, None, None, 7)]
    assert encode.with_token_arrays(kept) is kept
    shipped = encode.with_token_arrays([(1, 1, ev.NODE_CREATE, 1, None, None,
                                         (0, "ns", toks.tobytes()))])
    assert shipped[0][6][:2] == (0, "ns") and shipped[0][6][2] == toks
