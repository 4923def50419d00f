"""The hot path's frozen results keep their dataclass behaviour with the fast ``__init__``
(issue 17: the generated frozen ``__init__`` cost 4.5 us per ``MatchResult``)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from radixscope.cache.results import EvictResult, InsertResult, LockReceipt, MatchResult


def test_fast_init_keeps_signature_defaults_and_frozenness():
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
