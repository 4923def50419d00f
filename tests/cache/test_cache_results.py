"""The hot path's frozen results keep their dataclass behaviour with slots and the fast
``__init__`` (issue 17: the generated frozen ``__init__`` cost 4.5 us per ``MatchResult``; a
``__dict__`` filled in ``__init__`` made every read of a field the interpreter's slow path)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from radixscope.cache.results import (
    EvictResult,
    InsertResult,
    LockReceipt,
    MatchResult,
    StorageMatchResult,
)


def test_results_keep_signature_defaults_and_frozenness():
    r = LockReceipt(1, 2, "r", "device", (("full", (1, 2, 3)),))
    assert (r.skipped, r.swa_released, r.cache_instance) == ((), False, 0)
    assert r == LockReceipt(receipt_id=1, anchor=2, owner="r", tier="device",
                            pins=(("full", (1, 2, 3)),))
    assert hash(r) == hash(pickle.loads(pickle.dumps(r)))
    assert repr(r).startswith("LockReceipt(receipt_id=1, anchor=2, owner='r'")
    assert dataclasses.replace(r, swa_released=True).swa_released is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.anchor = 5
    with pytest.raises(TypeError, match="missing 3 required positional arguments"):
        InsertResult(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nodes'"):
        EvictResult(1, (), (), nodes=3)
    m = MatchResult(device_indices=torch.arange(3), device_prefix_len=3, last_device_node=4,
                    last_host_node=4, best_match_node=4)
    assert (m.host_hit_length, m.extra_key, m.mamba_slot, m.needs_load_back) == (0, None, None,
                                                                               False)
    assert [f.name for f in dataclasses.fields(m)][:2] == ["device_indices", "device_prefix_len"]


def test_results_hold_their_fields_in_slots_not_a_dict():
    m = MatchResult(device_indices=torch.arange(3), device_prefix_len=3, last_device_node=4,
                    last_host_node=4, best_match_node=4, key_len=8)
    s = StorageMatchResult.of(m, "started", 16, 4)
    r = InsertResult(1, 2, 3, 4)
    for x in (m, s, r, EvictResult(1, (), ()), LockReceipt(1, 2, "r", "device", ())):
        assert not hasattr(x, "__dict__"), type(x).__name__
    # the L3 fields: class attributes of a plain match, slots of a storage match
    assert (m.prefetch_status, m.prefetch_tokens) == ("off", 0)
    assert (s.prefetch_status, s.prefetch_tokens, s.storage_hit_length, s.key_len) == (
        "started", 16, 4, 8)
    back = pickle.loads(pickle.dumps(s))
    assert (type(back), back.prefetch_status, back.key_len) == (StorageMatchResult, "started", 8)
    # every name refused alike, a field or not (the dataclass's own frozen __setattr__ raised
    # TypeError on a slotted class for a name that is not a field)
    for obj, name in ((s, "prefetch_status"), (m, "prefetch_status"), (m, "foo"), (r, "key_len"),
                      (r, "extra")):
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"field '{name}'"):
            setattr(obj, name, 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(obj, name)
    with pytest.raises(AttributeError):
        object.__setattr__(r, "extra", 1)  # no slot: nowhere to put it
