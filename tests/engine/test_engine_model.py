"""The stand-in model: content is a pure function of the token prefix, and verification names
the request and the first wrong position."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import CacheConfig, HiRadixCache
from radixscope.engine.model import (
    M1,
    M2,
    P1,
    P2,
    ContentMismatch,
    StandInModel,
    namespace_salt,
    prefix_hashes,
)


def _by_hand(tokens: list[int], salt: int = 0) -> list[tuple[int, int]]:
    out, h1, h2 = [], 0, 0
    for j, t in enumerate(tokens):
        h1 = (h1 + (t % M1 + 1) * pow(P1, j, M1)) % M1
        h2 = (h2 + (t % M2 + 1) * pow(P2, j, M2)) % M2
        out.append(((h1 + salt) % M1, (h2 + salt) % M2))
    return out


def test_prefix_hashes_match_the_formula():
    toks = [5, 0, 31999, 7, 7, 123456789]
    assert prefix_hashes(torch.tensor(toks)).tolist() == [list(p) for p in _by_hand(toks)]
    salt = namespace_salt("lora-1")
    assert prefix_hashes(torch.tensor(toks), "lora-1").tolist() == \
        [list(p) for p in _by_hand(toks, salt)]
    assert prefix_hashes(torch.tensor(toks[:1]))[0].tolist() == [6, 6]


def test_hashes_depend_on_the_prefix_only():
    a = torch.randint(0, 32000, (300,), generator=torch.Generator().manual_seed(1))
    b = a.clone()
    b[200] = (b[200] + 1) % 32000
    ha, hb = prefix_hashes(a), prefix_hashes(b)
    assert torch.equal(ha[:200], hb[:200])
    assert bool((ha[200:] != hb[200:]).any(dim=1).all())  # every later position differs
    assert torch.equal(prefix_hashes(a[:120]), ha[:120])
    assert not torch.equal(prefix_hashes(a, "x"), ha)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_then_verify_and_catch_a_swapped_slot(dtype):
    cfg = CacheConfig.preset("hybrid", device_tokens=64, host_tokens=64, swa_device_tokens=64,
                             swa_host_tokens=64, mamba_slots=4, mamba_host_slots=4, dtype=dtype)
    cache = HiRadixCache(cfg)
    model = StandInModel(cfg)
    toks = torch.arange(10, 30)
    h = prefix_hashes(toks)
    idx = cache.alloc(20)
    model.write_kv(cache, "full", idx, h)
    model.verify_kv(cache, "full", idx, h, 0, "r1")
    got = cache.device_pools[0].buf[:, :, idx[3]]
    assert torch.equal(got, model.values("full", h[3:4]).view_as(got))  # the pool layout
    swapped = idx.clone()
    swapped[[7, 8]] = swapped[[8, 7]]
    with pytest.raises(ContentMismatch) as e:
        model.verify_kv(cache, "full", swapped, h, 100, "r1")
    assert (e.value.req_id, e.value.component, e.value.position, e.value.slot) == \
        ("r1", "full", 107, int(idx[8]))
    assert str(e.value) == (f"content mismatch in request r1: full KV at token position 107 "
                            f"(slot {int(idx[8])}) is not what the model wrote for that prefix")
    slot = cache.alloc(1, component="mamba")
    model.write_state(cache, slot, h[19])
    model.verify_state(cache, slot, h[19], 19, "r1")
    with pytest.raises(ContentMismatch, match="r1: mamba state at token position 18"):
        model.verify_state(cache, slot, h[18], 18, "r1")
    swa = cache.alloc(20, component="swa")
    model.write_kv(cache, "swa", swa, h)
    assert not torch.equal(model.values("swa", h), model.values("full", h))
    model.verify_kv(cache, "swa", swa, h, 0, "r1")


def test_values_are_24_bit_fractions():
    model = StandInModel(CacheConfig.preset("full"))
    v = model.values("full", prefix_hashes(torch.arange(50)))
    assert v.shape == (4, 50, 32)
    scaled = (v + 0.5) * (1 << 24)
    assert torch.equal(scaled, scaled.round())
    assert float(v.min()) >= -0.5 and float(v.max()) < 0.5
