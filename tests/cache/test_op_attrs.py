"""Op attributes as recorded: a tuple in ``OP_FIELDS`` order for the hot ops, named into the
same dict the sinks, the store and crash bundles have always seen."""

from __future__ import annotations

import pytest

from radixscope.cache import CacheConfig, HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.events import OP_FIELDS, FlightRecorder, attrs_dict, named_op
from radixscope.cache.op_attrs import OP_ATTRS
from tests.kits.cachekit import Driver
from tests.kits.l3kit import storage_cache, wait_prefetch, write_store


def _drive() -> tuple[HiRadixCache, FlightRecorder, dict]:
    rec = FlightRecorder()
    c = HiRadixCache(CacheConfig.preset("full", device_tokens=64, host_tokens=128), recorder=rec)
    key = list(range(1, 33))
    out = {}
    idx = c.alloc(32)
    out["insert"] = c.insert(key, idx, req_id="r1")
    out["match"] = c.match_prefix(key + [99], req_id="r2")
    out["lock"] = c.lock(out["match"].last_device_node, owner="r2")
    c.unlock(out["lock"])
    c.backup(out["insert"].last_node)
    c.poll()
    out["evict"] = c.evict(32)
    m = c.match_prefix(key)
    out["load_back"] = c.load_back(m)
    c.poll()
    extra = c.alloc(4)
    c.free(extra)
    c.evict_host(32)
    return c, rec, out


def test_hot_ops_record_tuples_in_op_fields_order_and_name_back() -> None:
    c, rec, out = _drive()
    raw = list(rec.ops)
    seen = {o[1] for o in raw}
    assert {ev.OP_MATCH, ev.OP_INSERT, ev.OP_LOCK, ev.OP_UNLOCK, ev.OP_ALLOC, ev.OP_FREE,
            ev.OP_EVICT, ev.OP_EVICT_HOST, ev.OP_BACKUP, ev.OP_LOAD_BACK} <= seen
    for o in raw:
        if o[1] not in OP_FIELDS:
            assert type(o[8]) is dict  # transfer acks and the like keep a dict
            continue
        assert type(o[8]) is tuple, o
        fields = OP_FIELDS[o[1]]
        # a match without a prefetch leaves out its three prefetch fields
        assert len(o[8]) == (9 if o[1] == ev.OP_MATCH else len(fields))
        named = named_op(o)
        assert list(named.attrs) == list(fields[:len(o[8])])
        assert named.attrs == attrs_dict(o[1], o[8])
    ops, _ = rec.tail()
    by_op = {}
    for op in ops:
        by_op.setdefault(op.op, []).append(op.attrs)
    ins = out["insert"]
    assert by_op[ev.OP_INSERT][0] == {ev.A_KEY_TOKENS: 32, ev.A_PREFIX_LEN: 0,
                                      ev.A_NEW_TOKENS: 32, ev.A_NODE: ins.last_node,
                                      ev.A_BRANCH: None, ev.A_BRANCH_NODE: None}
    m = out["match"]
    assert by_op[ev.OP_MATCH][0] == {
        ev.A_KEY_TOKENS: 33, ev.A_DEVICE_TOKENS: 32, ev.A_HOST_TOKENS: 0,
        ev.A_SWA_HOST_TOKENS: 0, ev.A_MAMBA_HOST: 0, ev.A_NODE: m.last_device_node,
        ev.A_BEST_NODE: m.best_match_node, ev.A_EXTRA_KEY: None, ev.A_BRANCH: None}
    lk = out["lock"]
    assert by_op[ev.OP_LOCK][0] == {ev.A_RECEIPT: lk.receipt_id, ev.A_NODE: lk.anchor,
                                    ev.A_OWNER: "r2", ev.A_NODES: 0}
    assert by_op[ev.OP_UNLOCK][0] == {ev.A_RECEIPT: lk.receipt_id, ev.A_NODE: lk.anchor,
                                      ev.A_OWNER: "r2"}
    e = out["evict"]
    assert by_op[ev.OP_EVICT][0] == {ev.A_COMPONENT: "full", ev.A_REQUESTED: 32,
                                     ev.A_FREED_TOKENS: e.freed_of("full"),
                                     ev.A_FREED: dict(e.freed),
                                     ev.A_NODES: len(e.evicted_nodes)}
    lb = out["load_back"]
    assert by_op[ev.OP_LOAD_BACK][0] == {ev.A_NODE: lb.anchor, ev.A_TRANSFER: lb.transfer_id,
                                         ev.A_TOKENS: 32, ev.A_FREED: {"full": 32}}
    assert {ev.A_COMPONENT: "full", ev.A_TOKENS: 4} in by_op[ev.OP_ALLOC]
    assert by_op[ev.OP_FREE] == [{ev.A_COMPONENT: "full", ev.A_TOKENS: 4}]
    c.check()


def test_attrs_dict_passes_dicts_and_names_unknown_ops_by_position() -> None:
    d = {"a": 1}
    assert attrs_dict(ev.OP_TRANSFER, d) is d
    assert attrs_dict(ev.OP_MATCH, None) == {} and attrs_dict(ev.OP_MATCH, ()) == {}
    assert attrs_dict("no-such-op", (7, "x")) == {"0": 7, "1": "x"}
    full = tuple(range(12))
    assert attrs_dict(ev.OP_MATCH, full) == dict(zip(OP_FIELDS[ev.OP_MATCH], full, strict=True))


def test_every_tuple_op_has_its_fields() -> None:
    """An op whose builder returns a tuple must be named by ``OP_FIELDS`` (else its attributes
    would come out by position)."""
    assert set(OP_ATTRS) - {ev.OP_PREFETCH} == set(OP_FIELDS)


def test_a_match_that_asks_a_prefetch_records_all_twelve_fields(tmp_path) -> None:
    toks = list(range(1, 65))
    write_store(tmp_path, toks)
    rec = FlightRecorder()
    c = storage_cache(tmp_path, recorder=rec, device_tokens=128, host_tokens=256)
    m = c.match_prefix(toks, req_id="r1", prefetch=True)
    wait_prefetch(c, "r1")
    raw = [o for o in rec.ops if o[1] == ev.OP_MATCH][-1]
    assert len(raw[8]) == len(OP_FIELDS[ev.OP_MATCH]) == 12
    a = named_op(raw).attrs
    assert list(a) == list(OP_FIELDS[ev.OP_MATCH])
    assert a[ev.A_PREFETCH_STATUS] == m.prefetch_status == "started"
    assert a[ev.A_PREFETCH_ASKED] == m.prefetch_tokens == 64
    assert a[ev.A_STORAGE_HIT] == m.storage_hit_length
    c.check()


def test_receipts_and_lock_records_name_the_pins_after_a_split() -> None:
    """A lock entry keeps its pins named once (receipt, ``lock.acquire``, ``lock.release``
    share them); a split inside the locked path adds a node to the entry, and the release must
    name it: ``check()`` compares the kept names with the entry."""
    rec = FlightRecorder()
    c = HiRadixCache(CacheConfig.preset("full", device_tokens=64, host_tokens=0), recorder=rec)
    d = Driver(c)
    d.insert(list(range(1, 17)))
    m = c.match_prefix(list(range(1, 17)))
    receipt = c.lock(m.last_device_node, owner="r")
    assert receipt.pins == (("full", (m.last_device_node,)),)
    c.match_prefix(list(range(1, 9)) + [99])  # splits the locked node after 8 tokens
    c.check()
    ids = tuple(c.locks[receipt.receipt_id].pins[0])
    assert len(ids) == 2 and ids[0] == m.last_device_node  # the new parent joined the lock
    c.unlock(receipt)
    release = [m for m in rec.mutations if m[2] == ev.LOCK_RELEASE][-1]
    assert release[6][1] == (("full", ids),)  # the release names the new parent too
    c.check()


def test_check_reports_stale_named_pins() -> None:
    c = HiRadixCache(CacheConfig.preset("full", device_tokens=64, host_tokens=0))
    Driver(c).insert(list(range(1, 17)))
    receipt = c.lock(c.match_prefix(list(range(1, 17))).last_device_node, owner="r")
    entry = c.locks[receipt.receipt_id]
    entry.named = (("full", (12345,)),)
    with pytest.raises(InvariantViolation, match="lock.named_pins"):
        c.check()
    entry.named = None  # rebuilt on demand
    c.check()
    c.unlock(receipt)
    c.check()
