"""Bad input raises a clear error naming the value, and changes nothing."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

from radixscope.cache import CacheConfig, CacheOutOfMemory, HiRadixCache, StaleHandle, TransferId
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import Driver, make_config


@pytest.fixture()
def loaded():
    c = HiRadixCache(make_config(("full", "swa", "mamba"), device_tokens=32, host_tokens=64))
    d = Driver(c)
    d.insert([1, 2, 3, 4, 5, 6])
    d.insert([1, 2, 3, 9, 9, 9])
    c.poll()
    held = c.alloc(2)
    receipt = c.lock(2, owner="req-1")
    return c, held, receipt


def _calls(c: HiRadixCache, held, receipt):
    stale = dataclasses.replace(receipt, receipt_id=999)
    match = c.match_prefix([1, 2, 3, 4, 5, 6])
    return {
        "key not a sequence": (lambda: c.match_prefix(3.5), TypeError, "float"),
        "key holds a float": (lambda: c.match_prefix([1, 2.5]), TypeError, "2.5"),
        "negative token": (lambda: c.match_prefix([1, -4, 2]), ValueError, "-4"),
        "2-D tensor key": (lambda: c.match_prefix(torch.zeros(2, 2, dtype=torch.int64)),
                           ValueError, "(2, 2)"),
        "float tensor key": (lambda: c.match_prefix(torch.zeros(3)), TypeError, "float32"),
        "bad namespace": (lambda: c.match_prefix([1], extra_key=[1]), TypeError, "[1]"),
        "value length": (lambda: c.insert([1, 2, 3], held, swa_indices=held), ValueError,
                         "2 entries but the key has 3"),
        "value not a tensor": (lambda: c.insert([1, 2], [0, 1]), TypeError, "list"),
        "unallocated slots": (lambda: c.insert([7, 7], torch.tensor([30, 31]),
                                               swa_indices=torch.tensor([30, 31])),
                              ValueError, "not allocated"),
        "swa missing": (lambda: c.insert([7, 7], held), ValueError, "swa_indices is required"),
        "unknown receipt": (lambda: c.unlock(stale), ValueError, "999"),
        "not a receipt": (lambda: c.unlock("r1"), TypeError, "str"),
        "double free": (lambda: c.free(torch.cat([held, held])), ValueError, "double free"),
        "free of tree slots": (lambda: c.free(c.node(2).data[0].values[Tier.DEVICE].clone()), ValueError,
                               "owned by the tree"),
        "free of never-allocated slot": (lambda: c.free(torch.tensor([31])), ValueError,
                                         "double free of slot(s) [31]"),
        "negative eviction": (lambda: c.evict(-5), ValueError, "-5"),
        "negative host eviction": (lambda: c.evict_host(-1), ValueError, "-1"),
        "unknown component": (lambda: c.evict(4, component="mla"), ValueError, "mla"),
        "negative alloc": (lambda: c.alloc(-2), ValueError, "-2"),
        "unknown node": (lambda: c.lock(12345), StaleHandle, "12345"),
        "node not an int": (lambda: c.lock("2"), TypeError, "'2'"),
        "unaligned swa_evicted_len": (lambda: c.insert([7, 7], held, swa_indices=held,
                                                       swa_evicted_len=-1), ValueError, "-1"),
        "admission extend": (lambda: c.admission(match, -3), ValueError, "-3"),
    }


CASES = [
    "key not a sequence", "key holds a float", "negative token", "2-D tensor key",
    "float tensor key", "bad namespace", "value length", "value not a tensor",
    "unallocated slots", "swa missing", "unknown receipt", "not a receipt", "double free",
    "free of tree slots", "free of never-allocated slot", "negative eviction", "negative host eviction",
    "unknown component", "negative alloc", "unknown node", "node not an int",
    "unaligned swa_evicted_len", "admission extend"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_rejected_before_any_change(loaded, case):
    c, held, receipt = loaded
    call, exc, needle = _calls(c, held, receipt)[case]
    before = c.snapshot()
    with pytest.raises(exc) as info:
        call()
    assert needle in str(info.value)
    c.check()
    assert c.snapshot() == before


def test_double_unlock_raises_and_keeps_state(loaded):
    c, _held, receipt = loaded
    c.unlock(receipt)
    before = c.snapshot()
    with pytest.raises(ValueError, match="already unlocked"):
        c.unlock(receipt)
    c.check()
    assert c.snapshot() == before


def test_receipt_from_another_cache_is_foreign(loaded):
    c, _held, receipt = loaded
    other = HiRadixCache(make_config(("full", "swa", "mamba"), device_tokens=32, host_tokens=64))
    with pytest.raises(ValueError, match="another cache instance"):
        other.unlock(receipt)


@pytest.mark.parametrize("field,value,needle", [
    ("page_size", 0, "page_size=0"),
    ("device_tokens", 30, "multiple of page_size=4"),
    ("write_policy", "write_around", "write_around"),
    ("components", ("swa",), "('swa',)"),
    ("sliding_window", 5, "sliding_window=5"),
    ("device", "tpu", "tpu"),
])
def test_config_rejects_bad_values_by_name(field, value, needle):
    kw = dict(page_size=4, device_tokens=32, host_tokens=64)
    kw[field] = value
    with pytest.raises(ValueError) as info:
        CacheConfig(**kw)
    assert needle in str(info.value)


# ---- the cache-operation battery: wrong types, negative / huge sizes, foreign handles, duplicates,
# slots the caller does not hold. Each: a clear error naming the bad value, nothing changed. ----
@pytest.fixture()
def busy():
    """A hybrid cache with tree nodes on device, a request's held slots, a live lock, an acked
    transfer and one backup still in flight; plus a second cache and its handles."""
    c = HiRadixCache(make_config(("full", "swa", "mamba"), device_tokens=32, host_tokens=64))
    d = Driver(c)
    first = d.insert([1, 2, 3, 4, 5, 6])
    c.poll()
    r = d.insert([1, 2, 3, 9, 9, 9])  # its write-through backup stays in flight
    other = HiRadixCache(make_config(("full", "swa", "mamba"), device_tokens=32, host_tokens=64))
    Driver(other).insert([1, 2, 3, 4])
    env = dict(c=c, node=c.node(first.last_node), flight=r.backups[0],
               held=c.alloc(2), held_swa=c.alloc(2, component="swa"),
               held_mamba=c.alloc(1, component="mamba"), receipt=c.lock(first.last_node),
               match=c.match_prefix([1, 2, 3, 4, 5, 6]), other=other,
               foreign_match=other.match_prefix([1, 2, 3, 4]),
               foreign_receipt=other.lock(other.match_prefix([1, 2]).last_device_node),
               foreign_tid=other.transfers and next(iter(other.poll())))
    return env


def _op_cases(e):  # noqa: C901 - one table
    c, node, held, hs, hm = e["c"], e["node"], e["held"], e["held_swa"], e["held_mamba"]
    tree_full = node.data[0].values[Tier.DEVICE]
    tree_swa = node.data[c.ci["swa"]].values[Tier.DEVICE]
    tree_mamba = node.data[c.ci["mamba"]].values[Tier.DEVICE]
    ins = c.insert
    key2 = [7, 8]
    n = len(tree_full)
    no_swa = torch.full((n,), -1)
    prefix = e["match"].device_indices
    return {
        # match_prefix
        "match key None": (lambda: c.match_prefix(None), TypeError, "None"),
        "match key dict": (lambda: c.match_prefix({1: 2}), TypeError, "dict"),
        "match key str": (lambda: c.match_prefix("abc"), TypeError, "str"),
        "match token None": (lambda: c.match_prefix([1, None]), TypeError, "None"),
        "match extra_key dict": (lambda: c.match_prefix([1], extra_key={}), TypeError, "{}"),
        # insert
        "insert float slots": (lambda: ins(key2, held.float(), swa_indices=hs), TypeError,
                               "float32"),
        "insert 2-D slots": (lambda: ins(key2, held.view(1, 2), swa_indices=hs), TypeError,
                             "(1, 2)"),
        "insert same slot twice": (lambda: ins(key2, torch.cat([held[:1], held[:1]]),
                                               swa_indices=hs), ValueError,
                                   f"[{held[0].item()}] appear more than once"),
        "insert another node's slots": (lambda: ins([7] * n, tree_full, swa_indices=no_swa,
                                                    swa_evicted_len=n), ValueError,
                                        "owned by the tree"),
        "insert tree prefix without prev": (
            lambda: ins([1, 2, 3, 4, 5, 6, 7, 8], torch.cat([prefix, held]), swa_indices=torch.cat(
                [torch.full((6,), -1), hs]), swa_evicted_len=6), ValueError, "owned by the tree"),
        "insert prev beyond the tree": (lambda: ins([5, 5], held, swa_indices=hs,
                                                    prev_prefix_len=2), ValueError,
                                        "prev_prefix_len=2 but the tree holds only 0"),
        "insert prev beyond the key": (lambda: ins(key2, held, swa_indices=hs,
                                                   prev_prefix_len=10**9), ValueError,
                                       "prev_prefix_len=1000000000"),
        "insert negative prev": (lambda: ins(key2, held, swa_indices=hs, prev_prefix_len=-1),
                                 ValueError, "prev_prefix_len=-1"),
        "insert float prev": (lambda: ins(key2, held, swa_indices=hs, prev_prefix_len=1.0),
                              ValueError, "prev_prefix_len=1.0"),
        "insert bool prev": (lambda: ins(key2, held, swa_indices=hs, prev_prefix_len=True),
                             ValueError, "prev_prefix_len=True"),
        "insert negative slot": (lambda: ins(key2, torch.tensor([-1, held[0].item()]),
                                             swa_indices=hs), ValueError, "out of range"),
        "insert huge slot": (lambda: ins(key2, torch.tensor([10**9, held[0].item()]),
                                         swa_indices=hs), ValueError, "out of range"),
        "insert swa wrong length": (lambda: ins(key2, held, swa_indices=hs[:1]), ValueError,
                                    "swa_indices has 1 entries"),
        "insert swa out of range": (lambda: ins(key2, held, swa_indices=torch.tensor([0, 10**6])),
                                    ValueError, "out of range"),
        "insert tree swa slots": (lambda: ins(key2, held, swa_indices=tree_swa[:2]), ValueError,
                                  "owned by the tree"),
        "insert swa slots twice": (lambda: ins(key2, held, swa_indices=hs[:1].repeat(2)),
                                   ValueError, "appear more than once"),
        "insert mamba two slots": (lambda: ins(key2, held, swa_indices=hs,
                                               mamba_slot=torch.cat([hm, hm])), ValueError,
                                   "mamba_slot has 2 entries"),
        "insert tree mamba slot": (lambda: ins(key2, held, swa_indices=hs, mamba_slot=tree_mamba),
                                   ValueError, "owned by the tree"),
        "insert unallocated mamba": (lambda: ins(key2, held, swa_indices=hs,
                                                 mamba_slot=torch.tensor([15])), ValueError,
                                     "[15] are not allocated"),
        "insert mamba as list": (lambda: ins(key2, held, swa_indices=hs, mamba_slot=[1]),
                                 TypeError, "list"),
        "insert negative swa_evicted_len": (lambda: ins(key2, held, swa_indices=hs,
                                                        swa_evicted_len=-2), ValueError, "-2"),
        # lock / unlock / release_swa
        "lock negative node": (lambda: c.lock(-1), StaleHandle, "-1"),
        "lock bool node": (lambda: c.lock(True), TypeError, "True"),
        "lock float node": (lambda: c.lock(2.0), TypeError, "2.0"),
        "lock int owner": (lambda: c.lock(node.id, owner=5), TypeError, "5"),
        "unlock foreign receipt": (lambda: c.unlock(e["foreign_receipt"]), ValueError,
                                   "another cache instance"),
        "unlock moved receipt": (lambda: c.unlock(dataclasses.replace(e["receipt"], anchor=10**6)),
                                 ValueError, "does not match the live lock"),
        "unlock None": (lambda: c.unlock(None), TypeError, "NoneType"),
        "release_swa foreign": (lambda: c.release_swa(e["foreign_receipt"]), ValueError,
                                "another cache instance"),
        "release_swa not a receipt": (lambda: c.release_swa(3), TypeError, "int"),
        # alloc / free
        "alloc float": (lambda: c.alloc(2.5), ValueError, "2.5"),
        "alloc bool": (lambda: c.alloc(True), ValueError, "True"),
        "alloc str": (lambda: c.alloc("4"), ValueError, "'4'"),
        "alloc huge": (lambda: c.alloc(10**12), CacheOutOfMemory, "requested 1000000000000"),
        "alloc unknown component": (lambda: c.alloc(1, component="kv"), ValueError, "'kv'"),
        "free list": (lambda: c.free([1, 2]), TypeError, "list"),
        "free float tensor": (lambda: c.free(held.float()), TypeError, "float32"),
        "free out of range": (lambda: c.free(torch.tensor([1000])), ValueError, "out of range"),
        "free negative slot": (lambda: c.free(torch.tensor([-3])), ValueError, "out of range"),
        "free tree swa slots": (lambda: c.free(tree_swa.clone(), component="swa"), ValueError,
                                "owned by the tree"),
        "free tree mamba slot": (lambda: c.free(tree_mamba.clone(), component="mamba"),
                                 ValueError, "owned by the tree"),
        "free held + tree": (lambda: c.free(torch.cat([held, tree_full])), ValueError,
                             "owned by the tree"),
        "free unknown component": (lambda: c.free(held, component="kv"), ValueError, "'kv'"),
        # evict / evict_host / backup
        "evict float": (lambda: c.evict(2.5), ValueError, "2.5"),
        "evict bool": (lambda: c.evict(True), ValueError, "True"),
        "evict str": (lambda: c.evict("all"), ValueError, "'all'"),
        "evict_host float": (lambda: c.evict_host(0.5), ValueError, "0.5"),
        "evict_host unknown component": (lambda: c.evict_host(1, component="kv"), ValueError,
                                         "'kv'"),
        "backup unknown node": (lambda: c.backup(999), StaleHandle, "999"),
        "backup str node": (lambda: c.backup("1"), TypeError, "'1'"),
        # load_back / admission
        "load_back str": (lambda: c.load_back("m"), TypeError, "str"),
        "load_back None": (lambda: c.load_back(None), TypeError, "NoneType"),
        "load_back foreign match": (lambda: c.load_back(e["foreign_match"]), ValueError,
                                    "another cache instance"),
        "load_back forged match": (lambda: c.load_back(dataclasses.replace(
            e["match"], cache_instance=0)), ValueError, "another cache instance"),
        "admission foreign match": (lambda: c.admission(e["foreign_match"], 4), ValueError,
                                    "another cache instance"),
        "admission float extend": (lambda: c.admission(e["match"], 2.5), ValueError, "2.5"),
        # poll
        "poll duplicate id": (lambda: c.poll([e["flight"], e["flight"]]), ValueError,
                              f"transfer {e['flight']} appears more than once"),
        "poll unknown id": (lambda: c.poll([999]), ValueError, "transfer 999 is not in flight"),
        "poll acked id": (lambda: c.poll([1]), ValueError, "transfer 1 was already acked"),
        "poll foreign id": (lambda: c.poll([TransferId(e["flight"], e["other"].instance)]),
                            ValueError, "another cache instance"),
        "poll str id": (lambda: c.poll(["1"]), TypeError, "'1'"),
        "poll bool id": (lambda: c.poll([True]), TypeError, "True"),
        "poll float id": (lambda: c.poll([1.0]), TypeError, "1.0"),
        "poll not iterable": (lambda: c.poll(5), TypeError, "5"),
        "poll negative id": (lambda: c.poll([-1]), ValueError, "transfer -1 is not in flight"),
        # read-only accessors
        "path_indices unknown component": (lambda: c.path_indices(node.id, component="kv"),
                                           ValueError, "'kv'"),
        "path_indices negative last": (lambda: c.path_indices(node.id, last=-1), ValueError,
                                       "last=-1"),
        "path_indices of a state": (lambda: c.path_indices(node.id, component="mamba"),
                                    ValueError, "'mamba'"),
        "evictable_slots bad tier": (lambda: c.evictable_slots(tier="disk"), ValueError,
                                     "'disk'"),
    }


def _op_case_names() -> list[str]:
    return re.findall(r'^        "([^"]+)": \(', inspect.getsource(_op_cases), re.M)


OP_CASES = _op_case_names()


@pytest.mark.parametrize("case", OP_CASES)
def test_cache_operation_bad_input_changes_nothing(busy, case):
    c = busy["c"]
    call, exc, needle = _op_cases(busy)[case]
    before = c.snapshot()
    with pytest.raises(exc) as info:
        call()
    assert needle in str(info.value), str(info.value)
    c.check()
    assert c.snapshot() == before


def test_the_battery_is_big_enough():
    assert len(OP_CASES) >= 50 and len(set(OP_CASES)) == len(OP_CASES)
