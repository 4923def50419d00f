"""Small host tensors (prefix hashes, slot lists) to the device without stalling the host.

A ``non_blocking`` copy from pageable memory is not asynchronous: CUDA stages it through a
driver buffer, and the host waits until the stream has drained up to the copy (the profiler
trace of the default run showed the stand-in model's hash uploads doing that every step). From
pinned memory the copy is queued and the host goes on. Pinning is slow, so the pinned buffers
are kept and reused, in a ring: each slot is a grow-only pinned buffer and the event recorded
after the last copy out of it; a slot is written again only once that event has completed (the
host waits for it, which by then has normally long happened), so no copy ever reads a buffer
that was overwritten under it.
"""

from __future__ import annotations

import torch

_MIN_BYTES = 4096


class PinnedUploads:
    """Copies host tensors to ``device`` through a ring of reused pinned buffers (CUDA only).

    Args:
        device: the CUDA device the tensors go to.
        slots: buffers in the ring (how many uploads may be in flight before one waits).
    """

    def __init__(self, device: torch.device, slots: int = 8) -> None:
        if device.type != "cuda":
            raise ValueError(f"PinnedUploads needs a CUDA device, got {device}")
        self.device = device
        self._bufs: list[torch.Tensor | None] = [None] * slots
        self._events = [torch.cuda.Event() for _ in range(slots)]
        self._used = [False] * slots
        self._next = 0

    def put(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the device, its copy queued on the device's current stream (a tensor
        already there is returned as it is)."""
        if t.is_cuda:
            return t.to(self.device)
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        i = self._next
        self._next = (i + 1) % len(self._bufs)
        if self._used[i]:
            self._events[i].synchronize()  # the copy that last read this buffer is done
        buf = self._bufs[i]
        if buf is None or buf.numel() < nbytes:
            size = max(_MIN_BYTES, 1 << max(nbytes - 1, 0).bit_length())
            buf = self._bufs[i] = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        host = buf[:nbytes].view(t.dtype).view(t.shape)
        host.copy_(t)
        out = host.to(self.device, non_blocking=True)
        self._events[i].record(torch.cuda.current_stream(self.device))
        self._used[i] = True
        return out


__all__ = ["PinnedUploads"]
