"""Bad input raises a clear error naming the value, and changes nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cache import CacheConfig, HiRadixCache, StaleHandle
from tests.cachekit import Driver, make_config


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
        "free of tree slots twice": (lambda: c.free(torch.tensor([31])), ValueError,
                                     "double free"),
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
    "free of tree slots twice", "negative eviction", "negative host eviction",
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
