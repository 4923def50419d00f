"""Host pages: how a backend reads and writes whole pages of a host pool's buffer.

A host KV pool is a ``[layers, 2, slots, heads, head_dim]`` buffer (``pools.KVPool``), a state
pool ``[slots, *state]`` (``pools.StatePool``). The cache names host memory by slot indices
(whole pages, as the allocator hands them out), so backends take ``(HostPages, host_indices)``
and never see the tree. One page is serialized in page-major order: the slice
``buf[:, :, s:s+page]`` made contiguous (``[layers, 2, page, heads, head_dim]``), or for state
pools the slots ``buf[s:s+page]``; ``layout`` names this for the key fingerprint.

``gather`` copies many pages into one page-major staging tensor with one ``index_select``;
``scatter`` writes the pages that arrived with one ``index_copy_``.
"""

from __future__ import annotations

import torch


class HostPages:
    """A view of a host buffer as pages of ``page_size`` slots along ``slot_dim``.

    Args:
        buf: the host pool's buffer (``KVPool.buf`` or ``StatePool.buf``), on the CPU.
        page_size: slots per page.
        slot_dim: the slot dimension (2 for KV pools, 0 for state pools).
    """

    def __init__(self, buf: torch.Tensor, page_size: int, slot_dim: int) -> None:
        if not isinstance(buf, torch.Tensor):
            raise TypeError(f"buf must be a tensor, got {type(buf).__name__}")
        if buf.device.type != "cpu":
            raise ValueError(f"host pages live on the CPU, got a buffer on {buf.device}")
        if not 0 <= slot_dim < buf.dim():
            raise ValueError(f"slot_dim={slot_dim} out of range for a {buf.dim()}-D buffer")
        if page_size < 1 or buf.shape[slot_dim] % page_size:
            raise ValueError(f"page_size={page_size} must divide the {buf.shape[slot_dim]} slots")
        self.buf = buf
        self.page_size = page_size
        self.slot_dim = slot_dim
        self.num_pages = buf.shape[slot_dim] // page_size
        shape = list(buf.shape)
        shape[slot_dim] = page_size
        self.page_shape = tuple(shape)
        n = 1
        for d in shape:
            n *= d
        self.page_numel = n
        self.page_nbytes = n * buf.element_size()

    @classmethod
    def of_pool(cls, pool: object, page_size: int) -> HostPages:
        """Pages of a ``pools.KVPool`` (slot dim 2) or ``pools.StatePool`` (slot dim 0)."""
        return cls(pool.buf, page_size, pool.slot_dim)  # type: ignore[attr-defined]

    @property
    def layout(self) -> str:
        """The serialized page layout, for the key fingerprint."""
        dims = ",".join(str(d) for d in self.page_shape)
        return f"page-major:slot_dim={self.slot_dim}:[{dims}]"

    def first_slots(self, host_indices: torch.Tensor) -> list[int]:
        """First slot of each whole page in ``host_indices``; ValueError if not whole pages."""
        if not isinstance(host_indices, torch.Tensor) or host_indices.dim() != 1 \
                or host_indices.dtype != torch.int64:
            raise TypeError("host_indices must be a 1-D int64 tensor")
        p = self.page_size
        n = host_indices.numel()
        if n % p:
            raise ValueError(f"{n} host indices are not whole pages of {p}")
        rows = host_indices.view(-1, p)
        first = rows[:, 0]
        if n and p > 1 and not torch.equal(rows - first[:, None],
                                           torch.arange(p).expand_as(rows)):
            raise ValueError("host indices are not whole consecutive pages")
        out = first.tolist()
        if any(s % p or s < 0 or s >= self.buf.shape[self.slot_dim] for s in out):
            raise ValueError(f"host indices not page-aligned or out of range: {out[:8]}")
        return out

    def _slot_index(self, firsts: list[int]) -> torch.Tensor:
        f = torch.tensor(firsts, dtype=torch.int64)
        return (f[:, None] + torch.arange(self.page_size)).reshape(-1)

    def gather(self, firsts: list[int]) -> torch.Tensor:
        """A ``[n, page_numel]`` contiguous copy of pages starting at ``firsts``."""
        d = self.slot_dim
        data = self.buf.index_select(d, self._slot_index(firsts))
        shape = list(self.buf.shape)
        shape[d:d + 1] = [len(firsts), self.page_size]
        return data.view(shape).movedim(d, 0).reshape(len(firsts), self.page_numel)

    def staging(self, n: int) -> torch.Tensor:
        """An empty ``[n, page_numel]`` buffer of the pool's dtype to read pages into."""
        return torch.empty((n, self.page_numel), dtype=self.buf.dtype)

    def scatter(self, firsts: list[int], pages: torch.Tensor) -> None:
        """Write ``pages`` (``[n, page_numel]``) to the pages starting at ``firsts``."""
        if not firsts:
            return
        d = self.slot_dim
        shape = list(self.page_shape)
        shape.insert(0, len(firsts))
        data = pages.view(shape).movedim(0, d)
        shape = list(self.buf.shape)
        shape[d] = len(firsts) * self.page_size
        self.buf.index_copy_(d, self._slot_index(firsts), data.reshape(shape))


def as_bytes(row: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor (no copy)."""
    return memoryview(row.contiguous().view(torch.uint8).numpy()).cast("B")
