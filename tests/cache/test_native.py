"""The native kernels (``cache/_native.c``) against their pure-Python versions (``cache/native.py``):
the same answer on random and edge inputs, the guard's scratch bitmap left zeroed, bad buffers
refused; in CI (``RADIXSCOPE_REQUIRE`` names ``native``) the module must have been built; and the
cache's scenarios pass on the pure versions too (``RADIXSCOPE_NATIVE=0``, in a subprocess)."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixscope.cache import HiRadixCache, native
from tests.kits.cachekit import make_config
from tests.kits.require import missing, pass_without_native

ROOT = Path(__file__).resolve().parents[2]
C = native._native


def needs_native() -> None:
    if C is None:
        missing("native", "the native kernels were not built (no C compiler at install, or "
                "RADIXSCOPE_NATIVE=0)")


def test_the_cache_runs_on_the_native_kernels_when_they_are_built() -> None:
    needs_native()
    assert native.KERNELS == "native"
    assert C.ABI == native.ABI
    assert all(getattr(native, n) is getattr(C, n) for n in native.NAMES)


def _marks(pages: int, tree: list[int], used: list[int]) -> tuple[np.ndarray, ...]:
    u = np.zeros(pages, np.uint8)
    t = np.zeros(pages, np.uint8)
    u[used] = 1
    u[tree] = 1
    t[tree] = 1
    return u, t, np.zeros(-(-pages // 8), np.uint8)


def _both_check_split(idx: list[int], split: int, u, t, seen) -> bool:
    a = np.array(idx, dtype=np.int64)
    want = native.check_split_py(a, split, u, t, seen)
    got = C.check_split(a, split, u, t, seen)
    assert got is want, (idx, split)
    assert not seen.any(), "the scratch bitmap must be left zeroed"
    return got


@given(pages=st.integers(1, 70), data=st.data())
@settings(max_examples=300, deadline=None)
def test_check_split_agrees_with_the_pure_version(pages: int, data) -> None:
    needs_native()
    tree = data.draw(st.lists(st.integers(0, pages - 1), max_size=pages, unique=True))
    used = data.draw(st.lists(st.integers(0, pages - 1), max_size=pages, unique=True))
    u, t, seen = _marks(pages, tree, used)
    pool = st.integers(-3, pages + 3)
    # mostly well-formed: tree pages, then request-held ones; sometimes anything at all
    lo = data.draw(st.lists(st.sampled_from(tree) if tree else pool, max_size=12))
    held = sorted(set(used) - set(tree))
    hi = data.draw(st.lists(st.sampled_from(held) if held else pool, max_size=12))
    if data.draw(st.booleans()):
        hi = hi + data.draw(st.lists(pool, max_size=3))
    split = data.draw(st.integers(-3, len(lo) + len(hi) + 3))
    if split < 0:
        for f in (C.check_split, native.check_split_py):
            with pytest.raises(ValueError, match=f"split={split}"):
                f(np.array(lo + hi, np.int64), split, u, t, seen)
        return
    _both_check_split(lo + hi, split, u, t, seen)


def test_check_split_edge_cases() -> None:
    needs_native()
    u, t, seen = _marks(16, tree=[0, 1, 2], used=[5, 6, 7, 15])
    assert _both_check_split([], 0, u, t, seen)
    assert _both_check_split([0, 1, 2, 5, 6, 15], 3, u, t, seen)
    assert _both_check_split([2, 2, 5], 2, u, t, seen)  # a tree page named twice below: allowed
    assert not _both_check_split([0, 1, 5, 6, 5], 2, u, t, seen)  # a held page named twice
    assert not _both_check_split([0, 5], 2, u, t, seen)  # a held page below the split
    assert not _both_check_split([0, 1], 1, u, t, seen)  # a tree page above it
    assert not _both_check_split([0, 8], 1, u, t, seen)  # a free page above it
    assert not _both_check_split([0, 16], 1, u, t, seen)  # out of range
    assert not _both_check_split([0, -1], 1, u, t, seen)  # negative: out of range, no wrap
    assert not _both_check_split([-(1 << 63)], 0, u, t, seen)
    assert _both_check_split([5, 6, 7], 0, u, t, seen)
    assert _both_check_split([0, 1, 2], 3, u, t, seen)


def test_check_split_refuses_bad_buffers() -> None:
    needs_native()
    u, t, seen = _marks(16, tree=[0], used=[1])
    idx = np.array([0, 1], np.int64)
    for f in (C.check_split, native.check_split_py):
        with pytest.raises(TypeError, match="indices"):
            f(idx.astype(np.int32), 1, u, t, seen)
        with pytest.raises(TypeError, match="indices"):
            f(idx.astype(np.float64), 1, u, t, seen)
    with pytest.raises(ValueError, match=r"seen 1 bytes \(2 needed\)"):
        C.check_split(idx, 1, u, t, seen[:1])
    with pytest.raises(ValueError, match="tree has 8 pages"):
        C.check_split(idx, 1, u, t[:8], seen)
    with pytest.raises(TypeError, match="used"):
        C.check_split(idx, 1, u.astype(np.int16), t, seen)
    with pytest.raises(ValueError, match="contiguous"):
        C.check_split(np.arange(8, dtype=np.int64)[::2], 1, u, t, seen)  # strided
    with pytest.raises(BufferError):
        C.check_split(idx, 1, u, t, bytes(2))  # read-only scratch


def _pool(pages: int, free: list[int], dtype) -> tuple[np.ndarray, np.ndarray]:
    """A free stack holding ``free`` (room for every page) and the used bitmap it implies
    (a page of ``free`` out of range is in the stack only: a corrupted allocator)."""
    stack = np.zeros(pages, dtype)
    stack[:len(free)] = free
    used = np.ones(pages, np.uint8)
    used[[p for p in free if 0 <= p < pages]] = 0
    return stack, used


@given(pages=st.integers(1, 40), dtype=st.sampled_from([np.int32, np.int64]), data=st.data())
@settings(max_examples=300, deadline=None)
def test_alloc_and_free_pages_agree_with_the_pure_versions(pages: int, dtype, data) -> None:
    needs_native()
    free = data.draw(st.lists(st.integers(0, pages - 1), max_size=pages, unique=True))
    if free and data.draw(st.booleans()):  # a corrupted stack: a used or out-of-range page
        free[data.draw(st.integers(0, len(free) - 1))] = data.draw(st.integers(-2, pages + 2))
    states = [_pool(pages, free, dtype) for _ in range(2)]
    top = len(free)
    k = data.draw(st.integers(0, top))
    outs = [np.full(k, -7, np.int64) for _ in range(2)]
    got = [f(stack, top, out, used) for f, (stack, used), out in
           zip((C.alloc_pages, native.alloc_pages_py), states, outs, strict=True)]
    assert got[0] == got[1]
    assert np.array_equal(states[0][1], states[1][1])
    if got[0] is None:
        assert outs[0].tolist() == outs[1].tolist() == free[::-1][:k]
        assert states[0][1][outs[0]].all()
    else:  # refused: nothing changed
        assert got[0] in free[::-1][:k]
        assert np.array_equal(states[0][1], _pool(pages, free, dtype)[1])
    # push back some pages, maybe a used one twice or a free one (a double free)
    marks = np.array(data.draw(st.lists(st.integers(0, 1), min_size=pages, max_size=pages)),
                     np.uint8)
    tree = [marks.copy() for _ in range(2)]
    back = np.array(data.draw(st.lists(st.integers(-1, pages), max_size=6)), np.int64)
    clear = data.draw(st.booleans())
    before = [(s.copy(), u.copy(), t.copy()) for (s, u), t in zip(states, tree, strict=True)]
    top2 = top - k if got[0] is None else top
    res = [f(back, used, t, stack, top2, clear) for f, (stack, used), t in
           zip((C.free_pages, native.free_pages_py), states, tree, strict=True)]
    assert res[0] == res[1]
    for (stack, used), t, (s0, u0, t0) in zip(states, tree, before, strict=True):
        if res[0] < 0:  # refused: nothing changed
            assert np.array_equal(stack, s0) and np.array_equal(used, u0)
            assert np.array_equal(t, t0)
        else:
            assert stack[top2:res[0]].tolist() == back.tolist()[::-1]  # last first
            assert not used[back].any()
            assert (not t[back].any()) if clear else np.array_equal(t, t0)
    assert np.array_equal(states[0][0], states[1][0]) and np.array_equal(states[0][1], states[1][1])
    assert np.array_equal(tree[0], tree[1])


def test_alloc_and_free_pages_refuse_bad_buffers() -> None:
    needs_native()
    stack, used = _pool(8, [3, 4], np.int64)
    with pytest.raises(ValueError, match="3 pages asked"):
        C.alloc_pages(stack, 2, np.empty(3, np.int64), used)
    with pytest.raises(TypeError, match="stack"):
        C.alloc_pages(stack.astype(np.int16), 2, np.empty(1, np.int64), used)
    with pytest.raises(TypeError, match="out"):
        C.alloc_pages(stack, 2, np.empty(1, np.int32), used)
    with pytest.raises(TypeError, match="pages"):
        C.free_pages(np.array([1], np.int32), used, np.zeros(8, np.uint8), stack, 2, False)
    assert C.free_pages(np.array([1]), used, np.zeros(7, np.uint8), stack, 2, False) == -2


def test_the_kernels_refuse_buffers_that_share_memory() -> None:
    """A buffer a kernel writes that overlaps another argument would let its writes change
    values it already checked: refused, nothing written."""
    needs_native()
    big = np.zeros(64, np.uint8)
    idx = big[:16].view(np.int64)  # [0, 0]
    with pytest.raises(ValueError, match="seen shares memory with indices"):
        C.check_split(idx, 0, np.ones(16, np.uint8), np.zeros(16, np.uint8), big[8:10])
    used = np.zeros(16, np.uint8)
    with pytest.raises(ValueError, match="out shares memory with used"):
        C.alloc_pages(np.array([8, 9]), 2, used.view(np.int64), used)
    assert not used.any()
    stack = np.zeros(8, np.int32)
    with pytest.raises(ValueError, match="stack shares memory with pages"):
        C.free_pages(stack[:4].view(np.int64), np.ones(8, np.uint8), np.zeros(8, np.uint8),
                     stack, 0, True)
    u = np.ones(8, np.uint8)
    with pytest.raises(ValueError, match="used shares memory with tree"):
        C.free_pages(np.array([1]), u, u, np.zeros(8, np.int64), 0, True)
    assert u.all()


def test_the_pure_kernels_refuse_what_the_native_ones_do() -> None:
    u = np.ones(8, np.uint8)
    with pytest.raises(TypeError, match="pages"):
        native.free_pages_py(np.array([0, 1], np.int32), u, np.zeros(8, np.uint8),
                             np.zeros(8, np.int32), 0, False)
    with pytest.raises(TypeError, match="out"):
        native.alloc_pages_py(np.array([1, 2]), 2, np.empty(1, np.int32), u)
    # an int32 stack holds ids below 2**31 only (a pool of 2**31 + 1 pages, never written)
    huge = np.broadcast_to(np.uint8(1), ((1 << 31) + 1,))
    assert native.free_pages_py(np.array([1 << 31]), huge, huge, np.zeros(4, np.int32), 0,
                                False) == -2


KEY = st.lists(st.integers(0, 3), max_size=40)


@given(a=KEY, b=KEY, off=st.integers(0, 45))
@settings(max_examples=400, deadline=None)
def test_common_len_agrees_with_the_pure_version(a: list[int], b: list[int], off: int) -> None:
    needs_native()
    aa, bb = array("Q", a), array("Q", b)
    want = native.common_len_py(aa, off, bb)
    assert C.common_len(aa, off, bb) == want
    assert want == next((i for i, (x, y) in enumerate(zip(a[off:], b, strict=False)) if x != y),
                        min(max(0, len(a) - off), len(b)))


def test_common_len_edges() -> None:
    needs_native()
    big = array("Q", [2**64 - 1, 7, 8])
    assert C.common_len(big, 0, array("Q", [2**64 - 1, 7])) == 2
    assert C.common_len(big, 1, array("Q", [7, 9])) == 1
    assert C.common_len(big, 3, big) == 0
    for f in (C.common_len, native.common_len_py):
        with pytest.raises(ValueError, match="a_off=-1"):
            f(big, -1, big)
    with pytest.raises(TypeError, match="b"):
        C.common_len(big, 0, array("I", [1]))


def test_strided_slots_are_taken_and_still_guarded() -> None:
    """A strided slot tensor (a view the C kernels cannot read whole) goes through the guard's
    numpy path and the push's copy: accepted when right, refused naming the slot when not."""
    c = HiRadixCache(make_config(("full",), device_tokens=32, host_tokens=0))
    wide = torch.zeros(8, dtype=torch.int64)
    wide[::2] = c.alloc(4)
    c.insert([1, 2, 3, 4], wide[::2])
    c.check()
    assert c.match_prefix([1, 2, 3, 4]).device_indices.tolist() == wide[::2].tolist()
    again = torch.zeros(8, dtype=torch.int64)
    again[::2] = wide[::2]  # the tree's slots handed over as the request's
    with pytest.raises(ValueError, match="device_indices"):
        c.insert([5, 6, 7, 8], again[::2])
    c.check()
    held = torch.zeros(6, dtype=torch.int64)
    held[::2] = c.alloc(3)
    before = c.available()
    assert c.free(held[::2]) == 3 and c.available() == before + 3  # the push's strided path
    with pytest.raises(ValueError, match="double free"):
        c.free(held[::2])
    c.check()


def test_the_cache_runs_the_same_on_the_pure_kernels() -> None:
    """Without the module (as on a machine with no C compiler) the cache's scenarios, guards and
    seeded random sequences pass unchanged."""
    pass_without_native(["tests/cache/test_cache_scenarios.py",
                         "tests/cache/test_cache_bad_input.py", "tests/cache/test_seed_bugs.py",
                         "tests/cache/test_cache_correctness.py",
                         "tests/cache/test_native.py::test_strided_slots_are_taken_and_still_guarded"])


def test_a_stale_or_missing_build_is_not_loaded(monkeypatch, caplog) -> None:
    """``load_built`` refuses a module of another ABI (naming it), one that is not there, and
    any under ``RADIXSCOPE_NATIVE=0``."""
    monkeypatch.delenv("RADIXSCOPE_NATIVE", raising=False)
    # native.py stands in for a stale build: its ABI is not the 7 asked for
    assert native.load_built("radixscope.cache.native", 7, "x.c", "y") is None
    assert (f"native.py was built from another x.c (ABI {native.ABI}, this code needs 7): "
            "running y") in caplog.text
    assert native.load_built("radixscope.cache._no_such_module", 1, "x.c", "y") is None
    if C is not None:
        assert native.load_built("radixscope.cache._native", native.ABI, "x.c", "y") is C
        monkeypatch.setenv("RADIXSCOPE_NATIVE", "0")
        assert native.load_built("radixscope.cache._native", native.ABI, "x.c", "y") is None



class _Slotted:
    __slots__ = ("a", "b")


class _Other:
    __slots__ = ("a",)


_SLOTS = (_Slotted.__dict__["a"], _Slotted.__dict__["b"])


@pytest.mark.parametrize("impl", ["native", "python"])
def test_fill_slots_sets_every_slot_or_refuses_before_setting_any(impl) -> None:
    if impl == "native":
        needs_native()
    fill = C.fill_slots if impl == "native" else native.fill_slots_py
    o = _Slotted()
    fill(o, _SLOTS, 1, [2])
    assert (o.a, o.b) == (1, [2])
    fill(o, _SLOTS, "x", None)  # set again: the old values released
    assert (o.a, o.b) == ("x", None)
    fresh = _Slotted()
    with pytest.raises(TypeError, match="1 values for 2 slots"):
        fill(fresh, _SLOTS, 1)
    for slots, what in (((_SLOTS[0], "b"), "not a member descriptor"),
                        ((_SLOTS[0], _Other.__dict__["a"]), "not a writable object slot"),
                        ((type.__dict__["__name__"],) * 2, "not a member descriptor"),
                        ((int.__dict__["real"],) * 2, "not a member descriptor")):
        with pytest.raises(TypeError, match=what):
            fill(fresh, slots, 1, 2)  # every descriptor checked before any slot is set
    with pytest.raises(TypeError, match="not a writable object slot"):
        fill(_Other(), _SLOTS, 1, 2)  # a slot of another type
    with pytest.raises(TypeError, match="takes"):
        fill(fresh, list(_SLOTS), 1, 2)
    assert not hasattr(fresh, "a") and not hasattr(fresh, "b")
