"""The hot path's native kernels (``cache/_native.c``, built by ``pip install``) and the
pure-Python versions they must agree with.

``check_split`` (insert's slot guard), ``common_len`` (a descent step's key compare),
``alloc_pages`` and ``free_pages`` (the allocator's pop and push with their bitmaps) are one C pass
each where numpy / ``array`` need three to nine calls or a slice copy: on the issue-17 workload the
guard costs ~3.5 us in place against ~15 us. ``untrack`` takes the containers of a tree node that no
reference cycle can pass through (its key, its component data and their lists: five of the eight
objects a FULL node is made of) off the garbage collector's lists, so a collection scans about three
objects a node instead of eight (Python cannot untrack an object itself; the Python version leaves
them tracked: the same cache, longer collections). ``fill_slots`` sets a frozen result's slots in
one call (``results.py``'s ``__init__``: a ``MatchResult`` in 0.5 us against 0.7 us for the
``__dict__`` it replaced; the slots' own setters, one call each, cost more than the dict).
``Fields`` is a recorded op's attribute builder made from a declarative spec (``op_attrs.py``): the
result's slots read by offset and the tuple built with no Python frame, in a third to a half of
the instructions of the Python builder it stands for (issue 17). Where the
module was not built (no C compiler at install) or ``RADIXSCOPE_NATIVE=0`` is set, ``KERNELS`` is
``"python"`` and the versions below run instead, with the same results (tests/cache/test_native.py
checks both on random and edge inputs)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from array import array
from collections.abc import Callable
from types import MemberDescriptorType

import numpy as np

NAMES = ("check_split", "common_len", "alloc_pages", "free_pages", "untrack", "fill_slots",
         "Fields")
ABI = 5  # _native.c's NATIVE_ABI: a build with another number is stale



def load_built(module: str, abi: int, source: str, fallback: str):
    """The compiled extension ``module`` when it was built, is current (its ``ABI`` is ``abi``)
    and ``RADIXSCOPE_NATIVE=0`` is not set; else None (a stale build is named in a warning).
    ``source`` and ``fallback`` name its C file and what runs instead, for that warning."""
    if os.environ.get("RADIXSCOPE_NATIVE", "1").strip() == "0":
        return None
    try:
        mod = importlib.import_module(module)
    except ImportError:  # built without a C compiler
        return None
    if getattr(mod, "ABI", None) != abi:
        logging.getLogger("radixscope").warning(
            "%s was built from another %s (ABI %s, this code needs %d): running %s; "
            "`pip install -e .` rebuilds it", mod.__file__, source, getattr(mod, "ABI", "none"),
            abi, fallback)
        return None
    return mod


_native = load_built("radixscope.cache._native", ABI, "_native.c", "the Python kernels")
KERNELS = "python" if _native is None else "native"

try:  # the C function itself: ``np.count_nonzero`` adds two Python-level calls (its dispatcher)
    from numpy._core.multiarray import count_nonzero as _count
except ImportError:  # numpy 1.x
    try:
        from numpy.core.multiarray import count_nonzero as _count
    except ImportError:
        _count = np.count_nonzero
_MAX = np.maximum.reduce  # the ufunc itself: ``ndarray.max`` adds a Python-level wrapper


def distinct(pages: np.ndarray) -> bool:
    if pages.size < 2:
        return True
    s = np.sort(pages)
    return not _count(s[1:] == s[:-1])


def _int64(a: np.ndarray, name: str) -> None:
    if a.dtype.kind not in "iu" or a.dtype.itemsize != 8:
        raise TypeError(f"{name}: expected 64-bit integers, got {a.dtype}")


def check_split_py(indices: np.ndarray, split: int, used: np.ndarray, tree: np.ndarray,
                   seen: np.ndarray) -> bool:
    """True when every page of ``indices`` is below ``len(used)``, ``indices[:split]`` are
    tree-marked and ``indices[split:]`` used, not tree-marked and distinct (``seen``: the C
    kernel's scratch bitmap, unused here). ValueError for ``split < 0``. Reads only."""
    if split < 0:
        raise ValueError(f"check_split: split={split} must be >= 0")
    _int64(indices, "indices")
    if not indices.size:
        return True
    if _MAX(indices.view(np.uint64)) >= used.size:
        return False
    marks = tree[indices]
    hi = indices[split:]
    return not (_count(marks[:split]) != min(split, indices.size) or _count(marks[split:])
                or _count(used[hi]) != hi.size or not distinct(hi))


def common_len_py(a: array, a_off: int, b: array) -> int:
    """How many leading items of ``a[a_off:]`` and ``b`` are equal: slices compared in C,
    galloping then bisecting, so a long key costs O(log n) slice compares."""
    if a_off < 0:
        raise ValueError(f"common_len: a_off={a_off} must be >= 0")
    n = max(0, min(len(a) - a_off, len(b)))
    if a[a_off:a_off + n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] matches, a[:hi] does not
    step = 1
    while step < hi and a[a_off:a_off + step] == b[:step]:
        lo = step
        step *= 2
    hi = min(step, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[a_off:a_off + mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def alloc_pages_py(stack: np.ndarray, top: int, out: np.ndarray, used: np.ndarray) -> int | None:
    """Pop ``len(out)`` pages off ``stack[:top]`` (the top first) into ``out`` and mark them
    used. Returns None, or, leaving the pool unchanged (``out`` is scratch then), the first
    popped page already used or out of range (a corrupted allocator). ValueError unless
    ``0 <= len(out) <= top <= len(stack)``."""
    _int64(out, "out")
    k = out.size
    if not 0 <= k <= top <= stack.size:
        raise ValueError(f"alloc_pages: {k} pages asked of a stack of {stack.size} (top {top})")
    if not k:
        return None
    out[:] = stack[top - k:top][::-1]  # scratch until checked
    if _MAX(out.view(np.uint64)) < used.size and not _count(used[out]):
        used[out] = 1
        return None
    bad = (out.view(np.uint64) >= used.size) | (used[np.clip(out, 0, used.size - 1)] != 0)
    return int(out[np.argmax(bad)])


def free_pages_py(pages: np.ndarray, used: np.ndarray, tree: np.ndarray, stack: np.ndarray,
                  top: int, clear_tree: bool) -> int:
    """Unmark ``pages`` used (and tree-owned with ``clear_tree``) and push them on the free
    stack at ``top``, last first: the next pops hand them out in the order given (a run of pages
    freed comes back a run, which a transfer copies as one DMA: ``copy_runs``). Returns the new
    top, or, changing nothing, -1 when a page is not used (a double free) and -2 when one is
    out of range (or past an int32 stack's ids) or the stack has no room."""
    _int64(pages, "pages")
    n = pages.size
    id_max = (1 << (8 * stack.itemsize - 1)) - 1  # the stack's largest id (signed)
    if top < 0 or top + n > stack.size or tree.size != used.size or (
            n and _MAX(pages.view(np.uint64)) >= min(used.size, id_max + 1)):
        return -2
    if _count(used[pages]) != n:
        return -1
    used[pages] = 0
    if clear_tree:
        tree[pages] = 0
    stack[top:top + n] = pages[::-1]
    return top + n


def fill_slots_py(obj: object, slots: tuple, *values: object) -> None:
    """``fill_slots`` where the module was not built: the same checks, all before any slot is
    set, then each slot through its descriptor."""
    if type(slots) is not tuple:
        raise TypeError("fill_slots takes (obj, slots: tuple, *values)")
    if len(values) != len(slots):
        raise TypeError(f"fill_slots: {len(values)} values for {len(slots)} slots")
    for i, d in enumerate(slots):
        if type(d) is not MemberDescriptorType:
            raise TypeError(f"fill_slots: slots[{i}] is {d!r}, not a member descriptor")
        if not isinstance(obj, d.__objclass__):
            raise TypeError(f"fill_slots: {d!r} is not a writable object slot of {type(obj)!r}")
    for d, v in zip(slots, values, strict=True):
        d.__set__(obj, v)


def untrack_py(*objs: object) -> None:
    """``untrack`` where the module was not built: Python cannot take an object off the
    collector's lists, so they stay tracked (collections scan them; nothing else differs)."""


# A ``Fields`` item's source (``(OUT, name)``: ``out.name``; ``(ARG, i)``: ``args[i]``;
# ``(GET, m, k, default)``: ``value[m].get(value[k], default)``) and what an OUT or ARG item
# makes of its value (a third element: ``v or None``, ``len(v)``, ``dict(v)``; none: ``v``)
OUT, ARG, GET = "out", "arg", "get"
OR_NONE, LEN, DICT = "or None", "len", "dict"
_type = type


def _index(v: object) -> int:
    """``v`` as an index (C's ``Py_ssize_t``), or -1."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v <= sys.maxsize else -1


def _item(i: int, item: object) -> tuple:
    """``spec[i]`` checked, as ``(source, key, how)`` or ``(GET, m, k, default)``."""
    def bad(exc: type[Exception], why: str) -> Exception:
        return exc(f"Fields: spec[{i}] is {item!r}: {why}")

    if not isinstance(item, tuple) or len(item) < 2:
        raise bad(TypeError, "an item is a tuple (source, key[, how])")
    src, key = item[0], item[1]
    if not isinstance(src, str) or src not in (OUT, ARG, GET):
        raise bad(ValueError, "its source is not 'out', 'arg' or 'get'")
    if src == GET:
        if len(item) != 4:
            raise bad(TypeError, "a 'get' item is ('get', mapping item, key item, default)")
        return (GET, _index(key), _index(item[2]), item[3])  # the items named: checked after
    if len(item) > 3:
        raise bad(TypeError, "an item is a tuple (source, key[, how])")
    how = item[2] if len(item) == 3 else None
    if how is not None and (not isinstance(how, str) or how not in (OR_NONE, LEN, DICT)):
        raise bad(ValueError, "its how is not None, 'or None', 'len' or 'dict'")
    if src == OUT:
        if _type(key) is not str:
            raise bad(TypeError, "an 'out' item names an attribute (a str)")
        return (OUT, key, how)
    if _index(key) < 0:
        raise bad(ValueError, "an 'arg' item's key is an index >= 0")
    return (ARG, key, how)


class FieldsPy:
    """``Fields`` where the module was not built: the same spec, checks and tuples, the spec
    interpreted item by item (slower than the hand-written builders it stands for, which
    ``op_attrs`` runs instead where this is the one). See ``_native.Fields``'s doc."""

    __slots__ = ("spec", "type", "fallback", "_items", "_gets")

    def __init__(self, spec: tuple, *, type: type | None = None,  # C's keyword; _type: the builtin
                 fallback: Callable | None = None) -> None:
        if not isinstance(spec, tuple):
            raise TypeError(f"Fields: spec must be a tuple of items, got {spec!r}")
        if not spec:
            raise ValueError("Fields: spec has no items")
        if type is not None and not isinstance(type, _type):
            raise TypeError(f"Fields: type must be a type or None, got {type!r}")
        if fallback is not None and (type is None or not callable(fallback)):
            raise TypeError("Fields: fallback must be callable and comes with a type (it builds "
                            f"a result of another type), got {fallback!r}")
        items = tuple(_item(i, item) for i, item in enumerate(spec))
        for i, it in enumerate(items):
            if it[0] == GET and not all(0 <= j < len(items) and items[j][0] != GET
                                        for j in it[1:3]):
                raise ValueError(f"Fields: spec[{i}] is {spec[i]!r}: a 'get' item names two "
                                 "other items by position, neither a 'get' item")
        self.spec, self.type, self.fallback = spec, type, fallback
        self._items = items
        self._gets = tuple(i for i, it in enumerate(items) if it[0] == GET)

    def __call__(self, cache: object, out: object, args: tuple) -> object:
        if self.type is not None and _type(out) is not self.type:
            if self.fallback is not None:
                return self.fallback(cache, out, args)
            raise TypeError(f"Fields: expected a result of type {self.type.__name__}, got "
                            f"{_type(out).__name__}")
        vals: list = [None] * len(self._items)
        for i, (src, key, how, *_) in enumerate(self._items):
            if src == GET:
                continue
            v = getattr(out, key) if src == OUT else args[key]
            if how == OR_NONE:
                v = v or None
            elif how == LEN:
                v = len(v)
            elif how == DICT:
                v = dict(v)
            vals[i] = v
        for i in self._gets:
            _, m, k, default = self._items[i]
            vals[i] = vals[m].get(vals[k], default)
        return tuple(vals)

    def __repr__(self) -> str:
        return f"Fields({self.spec!r}, type={self.type!r}, fallback={self.fallback!r})"


check_split = check_split_py if _native is None else _native.check_split
common_len = common_len_py if _native is None else _native.common_len
alloc_pages = alloc_pages_py if _native is None else _native.alloc_pages
free_pages = free_pages_py if _native is None else _native.free_pages
untrack = untrack_py if _native is None else _native.untrack
fill_slots = fill_slots_py if _native is None else _native.fill_slots
Fields = FieldsPy if _native is None else _native.Fields
