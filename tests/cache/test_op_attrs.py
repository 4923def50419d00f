"""Op attributes as recorded: a tuple in ``OP_FIELDS`` order for the hot ops, named into the
same dict the sinks, the store and crash bundles have always seen."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from radixscope.cache import CacheConfig, HiRadixCache, native
from radixscope.cache import events as ev
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.events import OP_FIELDS, FlightRecorder, attrs_dict, named_op
from radixscope.cache.op_attrs import OP_ATTRS, PY_ATTRS, SPECS
from radixscope.cache.results import MatchResult, StorageMatchResult
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config, random_session
from tests.kits.l3kit import storage_cache, wait_prefetch, write_store
from tests.kits.require import missing


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
    assert e.component == "full"
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


# ---- the hot ops' specs (native.Fields) against the Python builders -------------------------

def test_the_hot_ops_run_their_specs_natively_where_the_module_was_built() -> None:
    assert set(SPECS) == {ev.OP_MATCH, ev.OP_INSERT, ev.OP_EVICT, ev.OP_EVICT_HOST, ev.OP_LOCK,
                          ev.OP_UNLOCK, ev.OP_RELEASE_SWA, ev.OP_ALLOC}
    assert all(OP_ATTRS[op] is PY_ATTRS[op] for op in set(PY_ATTRS) - set(SPECS))
    if native.KERNELS != "native":
        missing("native", "the native kernels were not built")
    for op, (spec, kw) in SPECS.items():
        f = OP_ATTRS[op]
        assert type(f) is native._native.Fields and f.spec is spec, op
        assert (f.type, f.fallback) == (kw.get("type"), kw.get("fallback"))
    assert OP_ATTRS[ev.OP_MATCH].type is MatchResult


def _agreeing(monkeypatch) -> Counter:
    """Each hot op's builder in ``OP_ATTRS`` replaced by one that checks, on every call, that
    the builder it replaced (native where built), the spec interpreted (``FieldsPy``) and the
    Python builder give equal tuples, and records that; returns the counts by (op, case)."""
    seen: Counter = Counter()

    def check(op: str):
        spec, kw = SPECS[op]
        others = (OP_ATTRS[op], native.FieldsPy(spec, **kw))

        def build(cache, out, args):
            want = PY_ATTRS[op](cache, out, args)
            for b in others:
                got = b(cache, out, args)
                assert type(got) is tuple and got == want, (op, b, got, want)
            seen[op] += 1
            if op == ev.OP_INSERT and args[8]:
                seen["insert at a branching point"] += 1
            if op in (ev.OP_EVICT, ev.OP_EVICT_HOST):
                seen[f"{op} of {want[0]}"] += 1
            return want
        return build

    for op in SPECS:
        monkeypatch.setitem(OP_ATTRS, op, check(op))
    return seen


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
def test_the_specs_give_the_python_builders_tuples_on_real_results(combo, monkeypatch) -> None:
    """A random session, branching inserts and an eviction of every component on both tiers:
    every recorded match, insert, eviction, lock, alloc, unlock (and early SWA release) gets
    equal tuples from the three builders."""
    seen = _agreeing(monkeypatch)
    c = HiRadixCache(make_config(combo, device_tokens=48, host_tokens=96),
                     recorder=FlightRecorder())
    d = Driver(c, branching=True)
    d.insert(list(range(1, 25)), req_id="a")
    d.insert(list(range(1, 9)) + [99] * 8, req_id="b")  # a prefix without aux state at its end
    random_session(c, random.Random(17), 160, 12)
    for comp in combo:
        c.evict(8, component=comp)
        c.evict_host(8, component=comp)
    if "swa" in combo:  # a lock whose SWA window is released early, then unlocked
        m = c.match_prefix(list(range(1, 25)))
        c.unlock(c.release_swa(c.lock(m.last_device_node, owner="early")))
        assert seen[ev.OP_RELEASE_SWA] == 1
    c.poll(wait=True)
    c.check()
    assert seen[ev.OP_MATCH] > 30 and seen[ev.OP_INSERT] > 30 and seen[ev.OP_EVICT] > 10
    assert seen[ev.OP_LOCK] > 30 and seen[ev.OP_UNLOCK] > 30 and seen[ev.OP_ALLOC] > 30
    assert all(seen[f"{op} of {comp}"] for op in (ev.OP_EVICT, ev.OP_EVICT_HOST) for comp in combo)
    if "mamba" in combo:
        assert seen["insert at a branching point"]


def test_a_prefetch_match_goes_to_the_python_builder(tmp_path, monkeypatch) -> None:
    """A match of another type than ``MatchResult`` (the prefetch-aware one) is built by the
    fallback: all twelve fields, from every builder."""
    seen = _agreeing(monkeypatch)
    toks = list(range(1, 65))
    write_store(tmp_path, toks)
    rec = FlightRecorder()
    c = storage_cache(tmp_path, recorder=rec, device_tokens=128, host_tokens=256)
    m = c.match_prefix(toks, req_id="r1", prefetch=True)
    assert type(m) is StorageMatchResult and seen[ev.OP_MATCH] == 1
    wait_prefetch(c, "r1")
    raw = [o for o in rec.ops if o[1] == ev.OP_MATCH][-1]
    assert len(raw[8]) == 12 and raw[8][9:] == ("started", 64, 0)
