"""Memory: page-granular slot allocators over real torch buffers (device and pinned host).

``SlotAllocator`` hands out whole pages of slot indices and catches double alloc / double free
with a per-page bitmap. ``KVPool`` is a ``[layers, 2, slots, heads, head_dim]`` buffer;
``StatePool`` a ``[slots, *state_shape]`` buffer (MAMBA recurrent state, one slot per state).
Neither knows the tree.
"""

from __future__ import annotations

import numpy as np
import torch

from radixscope.cache import native
from radixscope.cache.native import _MAX, _count
from radixscope.cache.native import distinct as _distinct


def _np(indices: torch.Tensor | np.ndarray) -> np.ndarray:
    """A numpy view of a CPU index tensor (a copy for one on another device); an ndarray
    (slots the cache already converted) as is."""
    if type(indices) is np.ndarray:
        return indices
    return indices.numpy() if indices.is_cpu else indices.cpu().numpy()


class SlotAllocator:
    """Free-page stack plus per-page bitmaps, all numpy arrays.

    The free stack is an int32 (int64 past 2**31 pages) array with a top index and the bitmaps
    are uint8 arrays (one byte a page). The hot calls (``alloc``, ``free_owned``, insert's
    ``check_split``) are one native kernel each (``native.py``): one C pass over the pages and
    bitmaps, ~2-4x cheaper in place than the numpy calls they replace; the rest are a few numpy
    calls whatever their length. Indices cross the boundary as int64 tensors (sharing memory
    with numpy where they can).

    Args:
        name: pool name used in errors (``full/device``...).
        slots: capacity in slots; a multiple of ``page_size``.
        page_size: slots per page; every allocation and free is whole pages.
    """

    def __init__(self, name: str, slots: int, page_size: int) -> None:
        if slots % page_size:
            raise ValueError(f"{name}: slots={slots} is not a multiple of page_size={page_size}")
        self.name = name
        self.page_size = page_size
        self.capacity = slots
        self.num_pages = slots // page_size
        # the free stack: ``_stack[:_top]``, popped from the top (page 0 first); 4 bytes a page
        # while page ids fit (the stack is preallocated for every page of the pool)
        dt = np.int32 if self.num_pages < 2**31 else np.int64
        self._stack = np.arange(self.num_pages - 1, -1, -1, dtype=dt)
        self._top = self.num_pages
        self.available = slots  # free slots: ``_top * page_size``, kept with ``_top``
        self._used = np.zeros(self.num_pages, dtype=np.uint8)
        self._tree = np.zeros(self.num_pages, dtype=np.uint8)  # 1: a tree node holds the page
        self._seen = np.zeros(-(-self.num_pages // 8), dtype=np.uint8)  # check_split's scratch
        self._offsets = np.arange(page_size, dtype=np.int64)

    def used_slots(self) -> int:
        return (self.num_pages - self._top) * self.page_size

    def is_used(self, page: int) -> bool:
        return bool(self._used[page])

    def alloc(self, num_slots: int) -> torch.Tensor | None:
        """Slot indices for ``num_slots`` rounded up to whole pages, or None if short."""
        k = -(-num_slots // self.page_size)
        top = self._top
        if k > top:
            return None
        if k == 0:
            return torch.empty(0, dtype=torch.int64)
        picked = np.empty(k, dtype=np.int64)
        bad = native.alloc_pages(self._stack, top, picked, self._used)
        if bad is not None:
            raise RuntimeError(f"{self.name}: double alloc of page {bad}: the free stack holds a "
                               "page in use or out of range (allocator corrupted)")
        self._top = top - k
        self.available = (top - k) * self.page_size
        if self.page_size == 1:
            return torch.from_numpy(picked)
        return torch.from_numpy((picked[:, None] * self.page_size + self._offsets).reshape(-1))

    def pages_of(self, indices: torch.Tensor | np.ndarray, name: str | None = None
                 ) -> np.ndarray:
        """Page ids of whole-page ``indices`` (a numpy int64 array); raises TypeError /
        ValueError if they are not an int64 tensor of whole pages in range. A 1-D int64
        ndarray (a caller's tensor already converted once) is taken as is."""
        if type(indices) is np.ndarray and indices.dtype == np.int64 and indices.ndim == 1:
            a = indices
        elif not isinstance(indices, torch.Tensor) or indices.dim() != 1 \
                or indices.dtype != torch.int64:
            raise TypeError(f"{self.name}: indices must be a 1-D int64 tensor, got "
                            f"{getattr(indices, 'dtype', type(indices).__name__)}")
        else:
            a = _np(indices)
        p = self.page_size
        if p == 1:
            pages = a
        else:
            n = a.size
            if n % p:
                raise ValueError(f"{self.name}: {n} indices are not whole pages of {p}")
            rows = a.reshape(-1, p)
            pages = rows[:, 0]
            if n and (not np.array_equal(rows - pages[:, None], np.broadcast_to(
                    self._offsets, rows.shape)) or _count(pages % p)):
                raise ValueError(f"{self.name}: indices are not page-aligned whole pages: "
                                 f"{a[:min(n, 16)].tolist()}...")
            pages = pages // p
        # one reduce over the ids as unsigned: a negative id reads as one past any page
        if pages.size and _MAX(pages.view(np.uint64)) >= self.num_pages:
            lo, hi = int(pages.min()), int(pages.max())
            raise ValueError(f"{name or self.name}: slot index out of range [0, "
                             f"{self.capacity}): {lo * p}..{hi * p + p - 1}")
        return pages

    def _bad(self, pages: np.ndarray, mask: np.ndarray) -> list[int]:
        """The first few slots of ``pages`` where ``mask`` holds (for error messages)."""
        return [int(q) * self.page_size for q in pages[mask][:8]]

    def check_free(self, indices: torch.Tensor) -> np.ndarray:
        """Validate a free without doing it (no state change). Returns the page ids."""
        pages = self.pages_of(indices)
        used = self._used[pages]
        if _count(used) != pages.size:
            raise ValueError(f"{self.name}: double free of slot(s) {self._bad(pages, used == 0)}")
        if not _distinct(pages):
            raise ValueError(f"{self.name}: double free: pages repeated in one free call")
        return pages

    def check_live(self, indices: torch.Tensor, name: str) -> None:
        """Raise ValueError unless every index is an allocated slot."""
        pages = self.pages_of(indices, name)
        used = self._used[pages]
        if _count(used) != pages.size:
            raise ValueError(f"{name}: slots {self._bad(pages, used == 0)} are not allocated "
                             "(freed or never allocated)")

    def mark_tree(self, indices: torch.Tensor, owned: bool) -> None:
        """Record that a tree node took (``owned``) or dropped the whole-page ``indices``."""
        p = self.page_size
        a = _np(indices)
        self._tree[a if p == 1 else a[::p] // p] = 1 if owned else 0

    def tree_owned(self, page: int) -> bool:
        return bool(self._tree[page])

    def any_tree_owned(self, pages: np.ndarray) -> list[int]:
        """Slots (the first of each page, at most 8) of ``pages`` a tree node owns."""
        owned = self._tree[pages]
        return self._bad(pages, owned != 0) if _count(owned) else []

    def tree_pages(self) -> set[int]:
        """Every page a tree node owns (for the invariant check)."""
        return set(np.flatnonzero(self._tree).tolist())

    def check_request_held(self, indices: torch.Tensor, name: str) -> None:
        """Raise ValueError (nothing changed) unless ``indices`` are whole pages, each allocated,
        held by a request (no tree node owns it) and named once. One C pass settles the good
        case (``_split_ok``); the checks below name what is wrong."""
        if self._split_ok(indices, 0):
            return
        pages = self.pages_of(indices, name)
        used = self._used[pages]
        if _count(used) != pages.size:
            raise ValueError(f"{name}: slots {self._bad(pages, used == 0)} are not allocated "
                             "(freed or never allocated)")
        tree = self._tree[pages]
        if _count(tree):
            raise ValueError(f"{name}: slots {self._bad(pages, tree != 0)} are owned by the "
                             "tree, not held by the request")
        if not _distinct(pages):
            seen: set[int] = set()
            dup = [q * self.page_size for q in pages.tolist() if q in seen or seen.add(q)]
            raise ValueError(f"{name}: slots {dup[:8]} appear more than once")

    def check_tree_owned(self, indices: torch.Tensor, name: str) -> None:
        """Raise ValueError unless every slot of ``indices`` is owned by a tree node."""
        pages = self.pages_of(indices, name)
        tree = self._tree[pages]
        if _count(tree) != pages.size:
            raise ValueError(f"{name}: slots {self._bad(pages, tree == 0)} are not held by the "
                             "tree")

    def check_split(self, indices: np.ndarray, split: int, below: str, above: str) -> None:
        """``check_tree_owned(indices[:split], below)`` and ``check_request_held(indices[split:],
        above)`` in one pass (insert's guard: the tree's slots below ``prev_prefix_len``, the
        request's from there on): ``native.check_split``, one C loop over the slots and the
        marks. Raises what those raise, before any change."""
        if not self._split_ok(indices, split):
            self._check_split_slow(indices, split, below, above)  # raises, naming the slot

    def _split_ok(self, indices, split: int) -> bool:
        """``native.check_split``'s verdict where it can give one: page size 1 and a 1-D int64
        array or tensor (its pages are its slots). False sends the caller to its slow path,
        which checks again and raises, naming the slot (or the type) that is wrong."""
        if self.page_size != 1:
            return False
        if type(indices) is not np.ndarray:
            if (not isinstance(indices, torch.Tensor) or indices.dim() != 1
                    or indices.dtype != torch.int64):
                return False
            indices = _np(indices)
        elif indices.ndim != 1 or indices.dtype != np.int64:
            return False
        try:
            return native.check_split(indices, split, self._used, self._tree, self._seen)
        except (BufferError, TypeError, ValueError):  # a strided buffer: the slow path settles it
            return False

    def _check_split_slow(self, indices: np.ndarray, split: int, below: str, above: str) -> None:
        if split:
            self.check_tree_owned(indices[:split], below)
        if indices.size > split:
            self.check_request_held(indices[split:], above)

    def free_owned(self, indices: torch.Tensor, tree: bool = False) -> int:
        """Return whole pages the cache itself holds: a node's value, or a request's slots its
        operation already checked (``check_request_held``). Only the used bitmap is checked
        (a double free still raises, before any change); their range and distinctness were
        settled when they entered the cache. ``tree``: the pages were a node's value and their
        tree marks go in the same pass (``mark_tree(indices, False)`` first, fused). Returns
        the number of slots freed."""
        p = self.page_size
        a = _np(indices)
        return self._push(a if p == 1 else a[::p] // p, tree)

    def free(self, indices: torch.Tensor, checked_pages: np.ndarray | None = None) -> int:
        """Return whole pages to the pool. Returns the number of slots freed."""
        pages = self.check_free(indices) if checked_pages is None else checked_pages
        return self._push(pages)

    def _push(self, pages: np.ndarray, tree: bool = False) -> int:
        """Unmark ``pages`` used (and tree-owned with ``tree``) and push them on the free stack
        (``native.free_pages``); a page not in use raises (a double free), before any change."""
        try:
            top = native.free_pages(pages, self._used, self._tree, self._stack, self._top, tree)
        except (BufferError, TypeError, ValueError):  # a strided or int32 view: made plain once
            pages = np.ascontiguousarray(pages, dtype=np.int64)
            top = native.free_pages(pages, self._used, self._tree, self._stack, self._top, tree)
        if top == -1:
            used = self._used[pages]
            raise ValueError(f"{self.name}: double free of slot(s) {self._bad(pages, used == 0)}")
        if top < 0:
            raise ValueError(f"{self.name}: freeing {pages.size} page(s) out of range or past the "
                             f"pool's {self.num_pages} (allocator corrupted)")
        self._top = top
        self.available = top * self.page_size
        return pages.size * self.page_size


class KVPool:
    """A KV buffer ``[layers, 2, slots, heads, head_dim]`` with its allocator."""

    slot_dim = 2  # the buffer's dimension of slots

    def __init__(self, name: str, layers: int, slots: int, heads: int, head_dim: int,
                 dtype: torch.dtype, device: str, page_size: int, pin: bool = False) -> None:
        self.name = name
        self.device = device
        self.alloc = SlotAllocator(name, slots, page_size)
        shape = (layers, 2, slots, heads, head_dim)
        self.buf = torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)
        self.bytes_per_slot = layers * 2 * heads * head_dim * self.buf.element_size()

    def read(self, idx: torch.Tensor) -> torch.Tensor:
        return self.buf.index_select(2, idx.to(self.buf.device))

    def write(self, idx: torch.Tensor, data: torch.Tensor) -> None:
        self.buf.index_copy_(2, idx.to(self.buf.device), data.to(self.buf.device))


class StatePool:
    """A recurrent-state buffer ``[slots, *state_shape]`` with its allocator (page size 1)."""

    slot_dim = 0  # the buffer's dimension of slots (a state of any rank follows it)

    def __init__(self, name: str, slots: int, state_shape: tuple[int, ...], dtype: torch.dtype,
                 device: str, pin: bool = False) -> None:
        self.name = name
        self.device = device
        self.alloc = SlotAllocator(name, slots, 1)
        self.buf = torch.zeros((slots, *state_shape), dtype=dtype, device=device, pin_memory=pin)
        self.bytes_per_slot = self.buf[0].numel() * self.buf.element_size() if slots else 0

    def read(self, idx: torch.Tensor) -> torch.Tensor:
        return self.buf.index_select(0, idx.to(self.buf.device))

    def write(self, idx: torch.Tensor, data: torch.Tensor) -> None:
        self.buf.index_copy_(0, idx.to(self.buf.device), data.to(self.buf.device))


def copy_slots(src, src_idx: torch.Tensor, dst, dst_idx: torch.Tensor,
               non_blocking: bool = False) -> int:
    """Copy slots between two pools of the same shape (KV or state). Returns bytes moved."""
    dim = src.slot_dim
    data = src.buf.index_select(dim, src_idx.to(src.buf.device))
    if data.device != dst.buf.device:
        data = data.to(dst.buf.device, non_blocking=non_blocking)
    dst.buf.index_copy_(dim, dst_idx.to(dst.buf.device), data)
    return src_idx.numel() * src.bytes_per_slot
