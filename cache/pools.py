"""Memory: page-granular slot allocators over real torch buffers (device and pinned host).

``SlotAllocator`` hands out whole pages of slot indices and catches double alloc / double free
with a per-page bitmap. ``KVPool`` is a ``[layers, 2, slots, heads, head_dim]`` buffer;
``StatePool`` a ``[slots, *state_shape]`` buffer (MAMBA recurrent state, one slot per state).
Neither knows the tree.
"""

from __future__ import annotations

from array import array

import torch

_SMALL = 256  # up to this many indices a check runs as Python loops, past it as torch calls


def _list(pages: list[int] | torch.Tensor) -> list[int]:
    return pages if isinstance(pages, list) else pages.tolist()


def _all(bitmap: bytearray, view: torch.Tensor, pages: list[int] | torch.Tensor) -> bool:
    if isinstance(pages, list):
        return all(map(bitmap.__getitem__, pages))
    return not pages.numel() or bool(view[pages].all())


def _any(bitmap: bytearray, view: torch.Tensor, pages: list[int] | torch.Tensor) -> bool:
    if isinstance(pages, list):
        return any(map(bitmap.__getitem__, pages))
    return bool(pages.numel()) and bool(view[pages].any())


def _distinct(pages: list[int] | torch.Tensor) -> bool:
    if isinstance(pages, list):
        return len(set(pages)) == len(pages)
    return torch.unique(pages).numel() == pages.numel()


def _view(bitmap: bytearray) -> torch.Tensor:
    """A uint8 tensor over ``bitmap``'s memory (writes to either are seen by both)."""
    if not bitmap:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(bitmap, dtype=torch.uint8)


class SlotAllocator:
    """Free-page stack plus a used-page bitmap.

    Page ids live in an ``array('q')`` (8 bytes a page, not a Python int object each) and the
    bitmap in a ``bytearray``: per call the cost is a few array operations per page, far below the fixed overhead of small torch ops. Indices
    cross the boundary as int64 tensors.

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
        self._free = array("q", range(self.num_pages - 1, -1, -1))  # a stack: page 0 first
        self._used = bytearray(self.num_pages)
        self._tree = bytearray(self.num_pages)  # 1: a tree node holds the page (device tier)
        # the same bitmaps as tensors sharing their memory: a validation of a few thousand
        # slots is then one gather in C, not a Python loop per page
        self._used_v = _view(self._used)
        self._tree_v = _view(self._tree)
        self._offsets = torch.arange(page_size, dtype=torch.int64)

    @property
    def available(self) -> int:
        """Free slots."""
        return len(self._free) * self.page_size

    def used_slots(self) -> int:
        return (self.num_pages - len(self._free)) * self.page_size

    def is_used(self, page: int) -> bool:
        return bool(self._used[page])

    def alloc(self, num_slots: int) -> torch.Tensor | None:
        """Slot indices for ``num_slots`` rounded up to whole pages, or None if short."""
        k = -(-num_slots // self.page_size)
        free = self._free
        if k > len(free):
            return None
        if k == 0:
            return torch.empty(0, dtype=torch.int64)
        picked = free[-k:]
        picked.reverse()
        used = self._used
        for p in picked:
            if used[p]:
                raise RuntimeError(f"{self.name}: double alloc of page {p} (allocator corrupted)")
            used[p] = 1
        del free[-k:]
        pages = torch.frombuffer(picked, dtype=torch.int64)
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def pages_of(self, indices: torch.Tensor) -> list[int]:
        """Page ids of whole-page ``indices``; raises ValueError if they are not whole pages."""
        if not isinstance(indices, torch.Tensor) or indices.dim() != 1 \
                or indices.dtype != torch.int64:
            raise TypeError(f"{self.name}: indices must be a 1-D int64 tensor, got "
                            f"{getattr(indices, 'dtype', type(indices).__name__)}")
        p = self.page_size
        if p == 1:
            pages = indices.tolist()
        else:
            n = indices.numel()
            if n % p:
                raise ValueError(f"{self.name}: {n} indices are not whole pages of {p}")
            rows = indices.view(-1, p)
            first = rows[:, 0]
            if n and not bool(torch.equal(rows - first[:, None], self._offsets.expand_as(rows))):
                raise ValueError(f"{self.name}: indices are not page-aligned whole pages: "
                                 f"{indices[:min(n, 16)].tolist()}...")
            pages = first.tolist()
            if any(q % p for q in pages):
                raise ValueError(f"{self.name}: indices are not page-aligned: {pages[:8]}")
            pages = [q // p for q in pages]
        if pages and (min(pages) < 0 or max(pages) >= self.num_pages):
            raise ValueError(f"{self.name}: slot index out of range [0, {self.capacity}): "
                             f"{min(pages) * p}..{max(pages) * p + p - 1}")
        return pages

    def check_free(self, indices: torch.Tensor) -> list[int]:
        """Validate a free without doing it (no state change). Returns the page ids."""
        pages = self.pages_of(indices)
        used = self._used
        if not all(map(used.__getitem__, pages)):
            bad = [q * self.page_size for q in pages if not used[q]]
            raise ValueError(f"{self.name}: double free of slot(s) {bad[:16]}")
        if len(set(pages)) != len(pages):
            raise ValueError(f"{self.name}: double free: pages repeated in one free call")
        return pages

    def check_live(self, indices: torch.Tensor, name: str) -> None:
        """Raise ValueError unless every index is an allocated slot."""
        pages = self._pages(indices, name)
        if not _all(self._used, self._used_v, pages):
            bad = [q * self.page_size for q in _list(pages) if not self._used[q]]
            raise ValueError(f"{name}: slots {bad[:8]} are not allocated (freed or never "
                             "allocated)")

    def _pages(self, indices: torch.Tensor, name: str) -> list[int] | torch.Tensor:
        """Page ids of whole-page ``indices``: a list for a few pages (Python's own loops are
        cheaper there), a tensor for many (a few torch calls whatever the length)."""
        if isinstance(indices, torch.Tensor) and indices.numel() <= _SMALL:
            return self.pages_of(indices)
        return self._page_tensor(indices, name)

    def _page_tensor(self, indices: torch.Tensor, name: str) -> torch.Tensor:
        """Page ids of whole-page ``indices`` as a tensor (type, alignment and range checked,
        in a few torch calls whatever the length)."""
        if not isinstance(indices, torch.Tensor) or indices.dim() != 1 \
                or indices.dtype != torch.int64:
            raise TypeError(f"{self.name}: indices must be a 1-D int64 tensor, got "
                            f"{getattr(indices, 'dtype', type(indices).__name__)}")
        p, n = self.page_size, indices.numel()
        if n == 0:
            return indices
        if p == 1:
            pages = indices
        else:
            if n % p:
                raise ValueError(f"{self.name}: {n} indices are not whole pages of {p}")
            rows = indices.view(-1, p)
            first = rows[:, 0]
            if not bool(torch.equal(rows - first[:, None], self._offsets.expand_as(rows))) \
                    or bool((first % p).any()):
                raise ValueError(f"{self.name}: indices are not page-aligned whole pages: "
                                 f"{indices[:min(n, 16)].tolist()}...")
            pages = first // p
        lo, hi = torch.aminmax(pages)
        if int(lo) < 0 or int(hi) >= self.num_pages:
            raise ValueError(f"{name}: slot index out of range [0, {self.capacity}): "
                             f"{int(lo) * p}..{int(hi) * p + p - 1}")
        return pages

    def mark_tree(self, indices: torch.Tensor, owned: bool) -> None:
        """Record that a tree node took (``owned``) or dropped the whole-page ``indices``."""
        p = self.page_size
        firsts = indices if p == 1 else indices[::p]
        flag, b = self._tree, 1 if owned else 0
        for s in firsts.tolist():
            flag[s // p] = b

    def tree_owned(self, page: int) -> bool:
        return bool(self._tree[page])

    def check_request_held(self, indices: torch.Tensor, name: str) -> None:
        """Raise ValueError (nothing changed) unless ``indices`` are whole pages, each allocated,
        held by a request (no tree node owns it) and named once."""
        pages = self._pages(indices, name)
        used, tree, p = self._used, self._tree, self.page_size
        if not _all(used, self._used_v, pages):
            bad = [q * p for q in _list(pages) if not used[q]]
            raise ValueError(f"{name}: slots {bad[:8]} are not allocated (freed or never "
                             "allocated)")
        if _any(tree, self._tree_v, pages):
            bad = [q * p for q in _list(pages) if tree[q]]
            raise ValueError(f"{name}: slots {bad[:8]} are owned by the tree, not held by the "
                             "request")
        if not _distinct(pages):
            seen: set[int] = set()
            dup = [q * p for q in _list(pages) if q in seen or seen.add(q)]
            raise ValueError(f"{name}: slots {dup[:8]} appear more than once")

    def check_tree_owned(self, indices: torch.Tensor, name: str) -> None:
        """Raise ValueError unless every slot of ``indices`` is owned by a tree node."""
        pages = self._pages(indices, name)
        if not _all(self._tree, self._tree_v, pages):
            bad = [q * self.page_size for q in _list(pages) if not self._tree[q]]
            raise ValueError(f"{name}: slots {bad[:8]} are not held by the tree")

    def free(self, indices: torch.Tensor, checked_pages: list[int] | None = None) -> int:
        """Return whole pages to the pool. Returns the number of slots freed."""
        pages = self.check_free(indices) if checked_pages is None else checked_pages
        used = self._used
        for q in pages:
            used[q] = 0
        self._free.extend(pages)
        return len(pages) * self.page_size


class KVPool:
    """A KV buffer ``[layers, 2, slots, heads, head_dim]`` with its allocator."""

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
    dim = 2 if isinstance(src, KVPool) else 0
    data = src.buf.index_select(dim, src_idx.to(src.buf.device))
    if data.device != dst.buf.device:
        data = data.to(dst.buf.device, non_blocking=non_blocking)
    dst.buf.index_copy_(dim, dst_idx.to(dst.buf.device), data)
    return src_idx.numel() * src.bytes_per_slot
