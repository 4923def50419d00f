"""Slot copies between pools as runs: stretches of slots consecutive on both sides.

A pool buffer keeps its slots along one dimension (2 for KV ``[layers, 2, slots, heads,
head_dim]``, 0 for state ``[slots, *state]``). Slots ``s .. s+n`` of such a buffer are ``rows``
stretches of ``n * inner`` elements, one per index of the dimensions before the slot dimension,
``pitch`` elements apart. So a run copies as one 2-D copy (``cudaMemcpy2DAsync``: one DMA
between pinned host memory and the device, whatever the layer count), or, where the CUDA
runtime is not at hand, one contiguous ``copy_`` per row.

``runs`` finds the runs of an index pair; ``Rows`` is a buffer's geometry; ``copy_rows`` is the
per-row fallback (plain torch, any device; a buffer of one row, a state pool, always goes this
way: each run is one contiguous copy); ``Memcpy2D`` calls the CUDA runtime's 2-D copy on a
stream, loaded from the ``libcudart`` of torch's own CUDA version that the process has mapped.
A pitch past the device's limit (``cudaDevAttrMaxPitch``) falls back to rows.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import torch

# cudaMemcpyDefault: the direction from the pointers (unified addressing)
_CUDA_MEMCPY_DEFAULT = 4
# cudaDevAttrMaxPitch (the driver's CU_DEVICE_ATTRIBUTE_MAX_PITCH): the largest pitch in bytes
_CUDA_DEV_ATTR_MAX_PITCH = 11


def runs(src: torch.Tensor | np.ndarray, dst: torch.Tensor | np.ndarray) -> np.ndarray:
    """``[k, 3]`` int64 rows ``(src_first, dst_first, length)``: the maximal stretches where
    both index lists go up by one, in order. ``src`` and ``dst`` are equal-length 1-D."""
    s = np.asarray(src.cpu() if isinstance(src, torch.Tensor) else src, dtype=np.int64)
    d = np.asarray(dst.cpu() if isinstance(dst, torch.Tensor) else dst, dtype=np.int64)
    if s.shape != d.shape or s.ndim != 1:
        raise ValueError(f"runs: index lists of shapes {s.shape} and {d.shape}; need equal 1-D")
    if s.size == 0:
        return np.empty((0, 3), dtype=np.int64)
    cut = np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [s.size]))
    return np.stack([s[starts], d[starts], ends - starts], axis=1)


class Rows:
    """A contiguous pool buffer seen as ``rows`` x ``slots`` x ``inner`` elements.

    Args:
        buf: the pool's buffer (contiguous).
        slot_dim: the dimension of its slots.
    """

    __slots__ = ("buf", "view", "rows", "slots", "inner", "esize", "ptr")

    def __init__(self, buf: torch.Tensor, slot_dim: int) -> None:
        if not buf.is_contiguous():
            raise ValueError("a pool buffer must be contiguous")
        shape = buf.shape
        self.buf = buf
        self.rows = int(np.prod(shape[:slot_dim], dtype=np.int64))
        self.slots = int(shape[slot_dim])
        self.inner = int(np.prod(shape[slot_dim + 1:], dtype=np.int64))
        self.view = buf.view(self.rows, self.slots, self.inner)
        self.esize = buf.element_size()
        self.ptr = buf.data_ptr()

    @property
    def pitch(self) -> int:
        """Bytes from one row's slot 0 to the next row's."""
        return self.slots * self.inner * self.esize

    def address(self, slot: int) -> int:
        """Address of ``slot`` in row 0."""
        return self.ptr + slot * self.inner * self.esize


def check_pair(src: Rows, dst: Rows) -> None:
    """Raise unless slots of ``src`` and ``dst`` hold the same rows of the same shape."""
    if (src.rows, src.inner, src.esize) != (dst.rows, dst.inner, dst.esize):
        raise ValueError(f"pools differ: {src.rows}x{src.inner} of {src.esize} B against "
                         f"{dst.rows}x{dst.inner} of {dst.esize} B")


def check_table(src: Rows, dst: Rows, table: np.ndarray) -> None:
    """Raise unless every run of ``table`` lies inside both buffers (a raw copy checks
    nothing)."""
    if len(table) and (table[:, :2].min() < 0 or (table[:, 0] + table[:, 2]).max() > src.slots
                       or (table[:, 1] + table[:, 2]).max() > dst.slots):
        raise ValueError(f"a run of slots past a pool's end ({src.slots} / {dst.slots} slots): "
                         f"{table[:4].tolist()}")


def copy_rows(src: Rows, dst: Rows, table: np.ndarray, non_blocking: bool = True) -> None:
    """Copy each run of ``table`` (``runs``'s rows) with one contiguous ``copy_`` per row."""
    check_table(src, dst, table)
    sv, dv = src.view, dst.view
    for s0, d0, n in table.tolist():
        for r in range(src.rows):
            dv[r, d0:d0 + n].copy_(sv[r, s0:s0 + n], non_blocking=non_blocking)


def _loaded_cudart(major: str) -> str | None:
    """The path of the ``libcudart.so.<major>`` this process has mapped (torch's own: another
    extension may map a runtime of another version), or None."""
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(" ")[-1]
                if f"/libcudart.so.{major}" in path:
                    return path
    except OSError:
        return None
    return None


class Memcpy2D:
    """``cudaMemcpy2DAsync`` from the CUDA runtime torch loaded; ``load()`` gives None where
    there is none to call (a CPU build, a torch linked statically), and the caller copies rows.
    """

    def __init__(self, lib: ctypes.CDLL, max_pitch: int) -> None:
        fn = lib.cudaMemcpy2DAsync
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        err = lib.cudaGetErrorString
        err.restype = ctypes.c_char_p
        err.argtypes = [ctypes.c_int]
        self._fn = fn
        self._err = err
        self.max_pitch = max_pitch
        self.row_copies = 0  # runs copied row by row (a state pool, or a pitch past the limit)

    @classmethod
    def load(cls, device: str) -> Memcpy2D | None:
        """The runtime's 2-D copy for ``device`` ('cuda' or 'cuda:N'), or None."""
        if not torch.cuda.is_available() or not torch.version.cuda:
            return None
        torch.cuda.init()
        path = _loaded_cudart(torch.version.cuda.split(".")[0])
        if path is None:
            return None
        try:
            lib = ctypes.CDLL(path)
            attr = lib.cudaDeviceGetAttribute
            attr.restype = ctypes.c_int
            attr.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
            v = ctypes.c_int(0)
            index = torch.device(device).index
            if attr(ctypes.byref(v), _CUDA_DEV_ATTR_MAX_PITCH,
                    torch.cuda.current_device() if index is None else index):
                return None
            return cls(lib, v.value if v.value > 0 else 2**31 - 1)  # 0: not reported
        except (OSError, AttributeError):
            return None

    def copy(self, src: Rows, dst: Rows, table: np.ndarray, stream: int) -> None:
        """Each run of ``table`` as one 2-D copy on ``stream`` (a raw ``cudaStream_t``). One
        row (a state pool), or a pitch past the device's limit: ``copy_rows`` on the current
        stream instead (the caller makes it ``stream``)."""
        if src.rows == 1 or max(src.pitch, dst.pitch) > self.max_pitch:
            copy_rows(src, dst, table)
            self.row_copies += len(table)
            return
        check_table(src, dst, table)
        width_per_slot = src.inner * src.esize
        spitch, dpitch = src.pitch, dst.pitch
        fn = self._fn
        for s0, d0, n in table.tolist():
            rc = fn(dst.address(d0), dpitch, src.address(s0), spitch, n * width_per_slot,
                    src.rows, _CUDA_MEMCPY_DEFAULT, stream)
            if rc:
                raise RuntimeError(f"cudaMemcpy2DAsync of {n} slot(s) ({src.rows} rows): "
                                   f"{self._err(rc).decode(errors='replace')} (error {rc})")


__all__ = ["runs", "Rows", "check_pair", "check_table", "copy_rows", "Memcpy2D"]
