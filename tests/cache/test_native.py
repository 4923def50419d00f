"""The native kernels (``cache/_native.c``) against their pure-Python versions (``cache/native.py``):
the same answer on random and edge inputs, the guard's scratch bitmap left zeroed, bad buffers
refused; in CI (``RADIXSCOPE_REQUIRE`` names ``native``) the module must have been built; and the
cache's scenarios pass on the pure versions too (``RADIXSCOPE_NATIVE=0``, in a subprocess)."""

from __future__ import annotations

import gc
import sys
import weakref
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


# ---- Fields: an op's attribute builder from a spec (op_attrs.SPECS) -------------------------

class _Res:
    __slots__ = ("a", "b", "pairs", "nodes", "comp")

    def __init__(self, a=1, b=0, pairs=(("full", 3), ("swa", 2)), nodes=(4, 5, 6), comp="swa"):
        self.a, self.b, self.pairs, self.nodes, self.comp = a, b, pairs, nodes, comp


_SPEC = ((native.OUT, "a"), (native.OUT, "b", native.OR_NONE), (native.ARG, 1, native.OR_NONE),
         (native.OUT, "pairs", native.DICT), (native.GET, 3, 5, 0), (native.OUT, "comp"),
         (native.OUT, "nodes", native.LEN), (native.ARG, 0))


def _fields(impl: str):
    if impl == "native":
        needs_native()
        return C.Fields
    return native.FieldsPy


IMPLS = pytest.mark.parametrize("impl", ["native", "python"])


@IMPLS
def test_fields_builds_the_tuple_its_spec_names(impl) -> None:
    f = _fields(impl)(_SPEC)
    r = _Res()
    assert f(None, r, ("x", 0)) == (1, None, None, {"full": 3, "swa": 2}, 2, "swa", 3, "x")
    r.b, r.comp = 7, "mamba"  # "or None" keeps a true value; a missing key gives the default
    assert f(None, r, ("x", 9)) == (1, 7, 9, {"full": 3, "swa": 2}, 0, "mamba", 3, "x")
    assert f.spec is _SPEC and f.type is None and f.fallback is None
    assert repr(f) == f"Fields({_SPEC!r}, type=None, fallback=None)"
    many = _fields(impl)(((native.ARG, 0),) * 40)  # past the C call's stack room for values
    assert many(None, r, ("y",)) == ("y",) * 40
    with pytest.raises(IndexError):
        many(None, r, ())


class _Sub(_Res):
    __slots__ = ()


class _Shadow(_Res):  # a subclass whose ``a`` is computed
    def __init__(self) -> None:
        self.comp = "swa"

    @property
    def a(self):
        return "shadowed"


class _Lazy:  # no slots: attributes from __getattr__
    def __getattr__(self, name):
        return f"lazy {name}"


@IMPLS
def test_fields_reads_any_type_right_and_guards_an_exact_one(impl) -> None:
    """A subclass, a shadowing property, a __getattr__ and a plain object all read as getattr
    would, whichever type the reads were learned on first; with ``type`` only that exact type
    is read and any other (a subclass too) goes to the fallback, or raises without one."""
    F = _fields(impl)
    f = F(((native.OUT, "a"), (native.OUT, "comp")))
    for _ in range(3):  # each read after another type's: the hint relearned every time
        assert f(None, _Res(a=1), ()) == (1, "swa")
        assert f(None, _Sub(a=2), ()) == (2, "swa")
        assert f(None, _Shadow(), ()) == ("shadowed", "swa")
        assert f(None, _Lazy(), ()) == ("lazy a", "lazy comp")
    seen = []
    g = F(((native.OUT, "a"),), type=_Res, fallback=lambda c, o, a: seen.append((c, o, a)) or 9)
    sub = _Sub(a=5)
    assert g(None, _Res(a=3), ()) == (3,) and g("c", sub, (1,)) == 9 and seen == [("c", sub, (1,))]
    h = F(((native.OUT, "a"),), type=_Res)
    with pytest.raises(TypeError, match="expected a result of type _Res, got _Sub"):
        h(None, sub, ())


@IMPLS
def test_fields_sees_a_type_changed_after_it_learned_it(impl) -> None:
    """Reads learned on a type stay right when the type's attribute is replaced at runtime
    (the type's version tag changes) and when it is put back."""
    class R:
        __slots__ = ("a", "b")

    slot = R.__dict__["a"]
    f = _fields(impl)(((native.OUT, "a"), (native.OUT, "b")))
    r = R()
    r.a, r.b = 1, 2
    assert f(None, r, ()) == (1, 2) and f(None, r, ()) == (1, 2)
    R.a = property(lambda self: "replaced")
    assert f(None, r, ()) == ("replaced", 2)
    R.a = slot
    assert f(None, r, ()) == (1, 2)
    R.__getattribute__ = lambda self, name: f"every {name}"
    assert f(None, r, ()) == ("every a", "every b")


class _Falsy:
    def __bool__(self):
        raise RuntimeError("no truth")


@IMPLS
def test_fields_raises_what_the_expressions_raise(impl) -> None:
    f = _fields(impl)(_SPEC)
    missing = _Res()
    del missing.comp
    bad = (
        (missing, ("x", 0), AttributeError, "comp"),  # an unset slot
        (_Res(b=_Falsy()), ("x", 0), RuntimeError, "no truth"),
        (_Res(nodes=5), ("x", 0), TypeError, "has no len"),
        (_Res(pairs=((1, 2, 3),)), ("x", 0), ValueError, "length 3"),
        (_Res(pairs=7), ("x", 0), TypeError, "not iterable"),
        (_Res(comp=[]), ("x", 0), TypeError, "unhashable"),
        (_Res(), ("x",), IndexError, "out of range"),
        (_Res(), None, TypeError, "not subscriptable"),
    )
    for out, args, exc, what in bad:
        with pytest.raises(exc, match=what):
            f(None, out, args)
    pairs = [["full", 3], ("swa", 2)]  # not a tuple of 2-tuples: dict() itself
    assert f(None, _Res(pairs=pairs), ("x", 0))[3] == {"full": 3, "swa": 2}
    with pytest.raises(TypeError):
        f(None, _Res())


class _Map:
    def get(self, key, default):
        return ("got", key, default)


@IMPLS
def test_fields_get_reads_a_mapping_of_any_type(impl) -> None:
    f = _fields(impl)(((native.OUT, "pairs"), (native.GET, 0, 2, -1), (native.OUT, "comp")))
    assert f(None, _Res(pairs=_Map()), ())[1] == ("got", "swa", -1)
    assert f(None, _Res(pairs={"swa": 4}), ())[1] == 4
    with pytest.raises(AttributeError):
        f(None, _Res(pairs=(("swa", 1),)), ())  # a tuple has no .get


@IMPLS
def test_fields_refuses_a_bad_spec_naming_the_item(impl) -> None:
    F = _fields(impl)
    cases = (
        ("x", TypeError, "spec must be a tuple of items, got 'x'"),
        ((), ValueError, "spec has no items"),
        ((("out",),), TypeError, r"spec\[0\] is \('out',\): an item is a tuple"),
        ((("out", "a", None, 1),), TypeError, "an item is a tuple"),
        ((("in", "a"),), ValueError, "its source is not 'out', 'arg' or 'get'"),
        (((1, "a"),), ValueError, "its source is not"),
        ((("out", 3),), TypeError, "an 'out' item names an attribute"),
        ((("out", "a", "huh"),), ValueError, "its how is not None, 'or None', 'len' or 'dict'"),
        ((("arg", -1),), ValueError, "an 'arg' item's key is an index >= 0"),
        ((("arg", True),), ValueError, "an 'arg' item's key is an index >= 0"),
        ((("arg", 1 << 70),), ValueError, "an 'arg' item's key is an index >= 0"),
        ((("get", 0, 1),), TypeError, "a 'get' item is"),
        ((("out", "a"), ("get", 0, 5, 0)), ValueError, r"spec\[1\] is .*names two other items"),
        ((("out", "a"), ("get", 1, 0, 0)), ValueError, "neither a 'get' item"),
        ((("out", "a"), ("get", 0, True, 0)), ValueError, "names two other items"),
    )
    for spec, exc, what in cases:
        with pytest.raises(exc, match=what):
            F(spec)
    with pytest.raises(TypeError, match="type must be a type or None"):
        F((("out", "a"),), type=3)
    with pytest.raises(TypeError, match="fallback must be callable and comes with a type"):
        F((("out", "a"),), fallback=print)
    with pytest.raises(TypeError, match="fallback must be callable"):
        F((("out", "a"),), type=_Res, fallback=3)
    with pytest.raises(TypeError):
        F((("out", "a"),), _Res)  # type is keyword-only


def test_fields_holds_no_reference_it_should_not() -> None:
    """The values, the args, the spec's parts and the fallback keep their reference counts
    over many calls, failing ones included (a failure after some items were read)."""
    needs_native()
    vals = [object() for _ in range(4)]
    name, default = "".join(["co", "mp"]), object()
    spec = ((native.OUT, "a"), (native.OUT, "pairs", native.DICT), (native.GET, 1, 4, default),
            (native.OUT, "nodes"), (native.OUT, name), (native.ARG, 0, native.OR_NONE))

    def fb(cache, out, args):
        return vals[0]

    f = C.Fields(spec, type=_Res, fallback=fb)
    ok = _Res(a=vals[0], pairs=((vals[1], vals[2]),), nodes=vals[3], comp=vals[1])
    broken = _Res(a=vals[0], pairs=((vals[1], vals[2]),), nodes=vals[3])
    del broken.comp
    args = (vals[2],)
    watched = [*vals, name, default, fb, spec, ok, broken, args]
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(100):
        assert f(None, ok, args) == (vals[0], {vals[1]: vals[2]}, vals[2], vals[3], vals[1],
                                     vals[2])
        with pytest.raises(AttributeError):
            f(None, broken, args)
        assert f(None, _Sub(), args) is vals[0]
    assert [sys.getrefcount(x) for x in watched] == before


def test_fields_in_a_cycle_with_its_fallback_is_collected() -> None:
    needs_native()

    class Fallback:
        def __call__(self, cache, out, args):
            return ()

    fb = Fallback()
    fb.fields = C.Fields(((native.OUT, "a"),), type=_Res, fallback=fb)
    gone = weakref.ref(fb)
    del fb
    gc.collect()
    assert gone() is None
