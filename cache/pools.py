"""Memory: page-granular slot allocators over real torch buffers (device and pinned host).

``SlotAllocator`` hands out whole pages of slot indices and catches double alloc / double free
with a per-page bitmap. ``KVPool`` is a ``[layers, 2, slots, heads, head_dim]`` buffer;
``StatePool`` a ``[slots, *state_shape]`` buffer (MAMBA recurrent state, one slot per state).
Neither knows the tree.
"""

from __future__ import annotations

import torch


class SlotAllocator:
    """Free-page stack plus a used-page bitmap. All checks are vectorised.

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
        self._free = torch.arange(self.num_pages - 1, -1, -1, dtype=torch.int64)  # stack
        self._top = self.num_pages
        self._used = torch.zeros(self.num_pages, dtype=torch.bool)
        self._offsets = torch.arange(page_size, dtype=torch.int64)

    @property
    def available(self) -> int:
        """Free slots."""
        return self._top * self.page_size

    def alloc(self, num_slots: int) -> torch.Tensor | None:
        """Slot indices for ``num_slots`` rounded up to whole pages, or None if short."""
        pages = -(-num_slots // self.page_size)
        if pages > self._top:
            return None
        if pages == 0:
            return torch.empty(0, dtype=torch.int64)
        picked = self._free[self._top - pages:self._top].flip(0)
        if bool(self._used[picked].any()):
            raise RuntimeError(f"{self.name}: double alloc of pages "
                               f"{picked[self._used[picked]].tolist()} (allocator corrupted)")
        self._top -= pages
        self._used[picked] = True
        if self.page_size == 1:
            return picked.clone()
        return (picked[:, None] * self.page_size + self._offsets).reshape(-1)

    def pages_of(self, indices: torch.Tensor) -> torch.Tensor:
        """Page ids of whole-page ``indices``; raises ValueError if they are not whole pages."""
        if indices.dim() != 1 or indices.dtype != torch.int64:
            raise TypeError(f"{self.name}: indices must be a 1-D int64 tensor, got "
                            f"{indices.dtype} shape {tuple(indices.shape)}")
        n = indices.numel()
        if n and (int(indices.min()) < 0 or int(indices.max()) >= self.capacity):
            raise ValueError(f"{self.name}: slot index out of range [0, {self.capacity}): "
                             f"min {int(indices.min())}, max {int(indices.max())}")
        p = self.page_size
        if p == 1:
            return indices
        if n % p:
            raise ValueError(f"{self.name}: {n} indices are not whole pages of {p}")
        rows = indices.view(-1, p)
        pages = rows[:, 0] // p
        if not bool(torch.equal(rows, pages[:, None] * p + self._offsets)):
            raise ValueError(f"{self.name}: indices are not page-aligned whole pages: "
                             f"{indices[:min(n, 16)].tolist()}...")
        return pages

    def check_free(self, indices: torch.Tensor) -> torch.Tensor:
        """Validate a free without doing it (no state change). Returns the page ids."""
        pages = self.pages_of(indices)
        if pages.numel() == 0:
            return pages
        if pages.numel() > 1 and torch.unique(pages).numel() != pages.numel():
            raise ValueError(f"{self.name}: double free: pages repeated in one free call")
        used = self._used[pages]
        if not bool(used.all()):
            raise ValueError(f"{self.name}: double free of slot(s) "
                             f"{(pages[~used] * self.page_size).tolist()[:16]}")
        return pages

    def free(self, indices: torch.Tensor, checked_pages: torch.Tensor | None = None) -> int:
        """Return whole pages to the pool. Returns the number of slots freed."""
        pages = self.check_free(indices) if checked_pages is None else checked_pages
        k = pages.numel()
        if k == 0:
            return 0
        self._used[pages] = False
        self._free[self._top:self._top + k] = pages
        self._top += k
        return k * self.page_size


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
