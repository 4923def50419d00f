"""Keys from every integer container an engine holds token ids in: lists and tuples, ``array``
of any integer typecode, numpy arrays and torch tensors (any integer dtype, strided or not; a dtype numpy cannot take goes item by item).
Each gives the key a list of the same ints gives, owns its tokens (the caller's buffer can
change after), and a bad one is refused naming the value and its position before the cache
changes."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache.keys import TokenKey
from tests.kits.cachekit import make_config

INT_TYPECODES = "bBhHiIlLqQ"
NP_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
TORCH_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                *(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))]


def _forms(ints: list[int], rng: random.Random) -> list[object]:
    """``ints`` in every container that can hold them."""
    top = max(ints, default=0)
    out: list[object] = [list(ints), tuple(ints)]
    for code in INT_TYPECODES:
        if top < 1 << (8 * array(code).itemsize - (code.islower())):
            out.append(array(code, ints))
    for dt in NP_DTYPES:
        if top <= np.iinfo(dt).max:
            a = np.array(ints, dtype=dt)
            out.append(a)
            pad = np.zeros(2 * len(ints), dtype=dt)  # a strided view of the same ints
            pad[::2] = a
            out.append(pad[::2])
    for dt in TORCH_DTYPES:
        if top <= torch.iinfo(dt).max:
            t = torch.tensor(ints, dtype=torch.int64).to(dt) if ints else torch.tensor([], dtype=dt)
            out.append(t)
            out.append(torch.stack([t, t], dim=1)[:, rng.randrange(2)])  # non-contiguous
    return out


@pytest.mark.parametrize("seed", range(8))
def test_every_integer_container_gives_the_lists_key(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([0, 1, 7, 2000])
    top = rng.choice([100, 255, 32000, 2**31 - 1, 2**63 - 1])
    ints = [rng.randrange(0, top + 1) for _ in range(n)]
    want = TokenKey(ints).tokens
    for form in _forms(ints, rng):
        key = TokenKey(form)
        assert key.tokens.typecode == want.typecode and key.tokens == want, type(form)


def test_a_tensor_numpy_cannot_take_goes_item_by_item(monkeypatch) -> None:
    """A dtype this torch cannot hand to numpy (unsigned ones, on old builds) still makes a
    key, through ``tolist()``."""
    def refuse(self):
        raise TypeError(f"can't convert {self.dtype} to numpy")

    monkeypatch.setattr(torch.Tensor, "numpy", refuse)
    assert list(TokenKey(torch.tensor([3, 0, 2**40])).tokens) == [3, 0, 2**40]
    with pytest.raises(ValueError, match="negative token id -1 at position 1"):
        TokenKey(torch.tensor([3, -1]))


def test_a_key_owns_its_tokens() -> None:
    a = np.arange(1, 9)
    t = torch.arange(1, 9)
    q = array("Q", range(1, 9))
    keys = [TokenKey(a), TokenKey(t), TokenKey(q)]
    a[0] = t[0] = q[0] = 99
    assert all(list(k.tokens) == list(range(1, 9)) for k in keys)


def test_the_cache_matches_a_tensor_or_numpy_key_as_the_list() -> None:
    c = HiRadixCache(make_config(device_tokens=256, host_tokens=0))
    ints = list(range(3, 40))
    idx = c.alloc(len(ints))
    c.insert(torch.tensor(ints), idx)
    for form in (ints, np.array(ints, dtype=np.int32), torch.tensor(ints, dtype=torch.int32),
                 array("i", ints)):
        m = c.match_prefix(form)
        assert m.device_prefix_len == len(ints) and torch.equal(m.device_indices, idx)
    c.check()


@pytest.mark.parametrize("bad, err, msg", [
    (np.array([4, -3, 2]), ValueError, "negative token id -3 at position 1"),
    (torch.tensor([1, 2, -9], dtype=torch.int16), ValueError, "negative token id -9 at position 2"),
    (array("i", [1, -2]), ValueError, "negative token id -2 at position 1"),
    (np.array([1.0, 2.0]), TypeError, "key array must have an integer dtype, got float64"),
    (np.array([True]), TypeError, "key array must have an integer dtype, got bool"),
    (np.zeros((2, 2), dtype=np.int64), ValueError, r"key array must be 1-D, got shape \(2, 2\)"),
    (array("f", [1.0]), TypeError, r"key must hold ints, found 1.0 \(float\) at position 0"),
    (torch.zeros(2, 2, dtype=torch.int64), ValueError, r"key tensor must be 1-D"),
    (np.ma.array([1, 2, 3], mask=[0, 1, 0]), TypeError, "key must not be a masked array .* shape \\(3,\\) with 1 masked"),
])
def test_a_bad_key_is_refused_before_the_cache_changes(bad, err, msg) -> None:
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=0))
    c.insert([1, 2, 3], c.alloc(3))
    before = (c.seq, c.available(), sorted(c.tree.nodes))
    with pytest.raises(err, match=msg):
        c.match_prefix(bad)
    with pytest.raises(err, match=msg):
        c.insert(bad, torch.arange(3))
    assert (c.seq, c.available(), sorted(c.tree.nodes)) == before
    c.check()
