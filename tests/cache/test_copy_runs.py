"""Slot copies as runs (``cache/copy_runs.py``): the run table, the per-row copy and the 2-D
copy's addresses and pitches, checked on the CPU against a plain gather and scatter. The CUDA
side (the runtime's ``cudaMemcpy2DAsync`` on the side stream) runs in tests/cache/test_gpu.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from radixscope.cache import copy_runs
from radixscope.cache.copy_runs import Memcpy2D, Rows, check_pair, copy_rows, runs
from radixscope.cache.pools import KVPool, StatePool


def test_runs_cut_where_either_side_breaks():
    t = runs(torch.tensor([4, 5, 6, 9, 10, 2]), torch.tensor([0, 1, 3, 4, 5, 6]))
    assert t.tolist() == [[4, 0, 2], [6, 3, 1], [9, 4, 2], [2, 6, 1]]
    assert runs(np.arange(5), np.arange(10, 15)).tolist() == [[0, 10, 5]]
    assert runs(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)).shape \
        == (0, 3)


def test_runs_refuse_lists_of_other_lengths():
    with pytest.raises(ValueError, match=r"\(3,\) and \(2,\)"):
        runs(np.arange(3), np.arange(2))


def _pools(kind: str, slots: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    if kind == "kv":
        src = KVPool("src", 3, slots, 2, 4, torch.float32, "cpu", 1)
        dst = KVPool("dst", 3, slots + 8, 2, 4, torch.float32, "cpu", 1)
    else:
        src = StatePool("src", slots, (2, 5), torch.float32, "cpu")
        dst = StatePool("dst", slots + 8, (2, 5), torch.float32, "cpu")
    src.buf.copy_(torch.rand(src.buf.shape, generator=g))
    dst.buf.copy_(torch.rand(dst.buf.shape, generator=g))
    return src, dst


def _random_indices(slots: int, n: int, rng: np.random.Generator) -> torch.Tensor:
    """Runs of random lengths at random places (distinct slots), as an allocator hands out
    after churn."""
    free = rng.permutation(slots // 4)  # blocks of 4: some stay whole, some are cut
    out: list[int] = []
    for b in free:
        take = int(rng.integers(1, 5))
        out.extend(range(4 * b, 4 * b + take))
        if len(out) >= n:
            break
    return torch.tensor(out[:n], dtype=torch.int64)


def _emulated_memcpy2d(max_pitch: int = 1 << 31) -> Memcpy2D:
    """A ``Memcpy2D`` whose runtime call is a row-by-row ``memmove`` on the CPU: same
    arguments, so the addresses and pitches it computes are checked for real."""
    calls = []

    def fn(dst, dpitch, src, spitch, width, height, kind, stream):
        assert width <= dpitch and width <= spitch and kind == 4 and stream == 7
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)
        calls.append(height)
        return 0

    m = Memcpy2D.__new__(Memcpy2D)
    m._fn = fn
    m._err = lambda rc: b"emulated"
    m.max_pitch = max_pitch
    m.row_copies = 0
    m.calls = calls
    return m


@pytest.mark.parametrize("kind", ["kv", "state"])
@pytest.mark.parametrize("seed", range(4))
def test_a_run_copy_writes_exactly_the_slots_a_gather_and_scatter_would(kind, seed):
    rng = np.random.default_rng(seed)
    src, dst = _pools(kind, 64, seed)
    dim = 2 if kind == "kv" else 0
    n = int(rng.integers(1, 40))
    s_idx = _random_indices(64, n, rng)
    d_idx = _random_indices(72, n, rng)
    want = dst.buf.clone()
    want.index_copy_(dim, d_idx, src.buf.index_select(dim, s_idx))
    table = runs(s_idx, d_idx)
    assert table[:, 2].sum() == n

    by_rows = dst.buf.clone()
    sr, dr = Rows(src.buf, dim), Rows(by_rows, dim)
    check_pair(sr, dr)
    copy_rows(sr, dr, table, non_blocking=False)
    assert torch.equal(by_rows, want)

    by_2d = dst.buf.clone()
    m = _emulated_memcpy2d()
    m.copy(Rows(src.buf, dim), Rows(by_2d, dim), table, 7)
    assert torch.equal(by_2d, want)
    if kind == "kv":  # one 2-D copy a run, whatever the layer count
        assert m.calls == [3 * 2] * len(table)
    else:  # one row: each run is one contiguous copy_, no pitch involved
        assert m.calls == []


def test_a_pitch_past_the_devices_limit_copies_rows_instead():
    src, dst = _pools("kv", 64, 0)
    want = dst.buf.clone()
    want[:, :, 8:20] = src.buf[:, :, 3:15]
    m = _emulated_memcpy2d(max_pitch=Rows(dst.buf, 2).pitch - 1)
    m.copy(Rows(src.buf, 2), Rows(dst.buf, 2), runs(np.arange(3, 15), np.arange(8, 20)), 7)
    assert m.calls == [] and torch.equal(dst.buf, want) and m.row_copies == 1


def test_the_max_pitch_asked_of_the_runtime_is_cuda_dev_attr_max_pitch():
    # regression: 27 (a 2-D layered texture's width, 32 KiB) was asked instead, so on a GPU
    # every KV pool's runs went row by row; the value is the runtime's and the driver's enum
    assert copy_runs._CUDA_DEV_ATTR_MAX_PITCH == 11


@pytest.mark.parametrize("table", [[[60, 0, 8]], [[0, 70, 4]], [[-1, 0, 2]]])
def test_a_run_past_a_pools_end_is_refused_before_any_copy(table):
    src, dst = _pools("kv", 64, 0)
    before = dst.buf.clone()
    m = _emulated_memcpy2d()
    with pytest.raises(ValueError, match="past a pool's end"):
        m.copy(Rows(src.buf, 2), Rows(dst.buf, 2), np.array(table), 7)
    with pytest.raises(ValueError, match="past a pool's end"):
        copy_rows(Rows(src.buf, 2), Rows(dst.buf, 2), np.array(table))
    assert m.calls == [] and torch.equal(dst.buf, before)


def test_pools_of_other_shapes_are_refused_before_any_copy():
    a = KVPool("a", 2, 16, 2, 4, torch.float32, "cpu", 1)
    b = KVPool("b", 2, 16, 2, 8, torch.float32, "cpu", 1)
    with pytest.raises(ValueError, match="pools differ"):
        check_pair(Rows(a.buf, 2), Rows(b.buf, 2))


def test_a_runtime_error_names_the_copy():
    m = Memcpy2D.__new__(Memcpy2D)
    m._fn = lambda *a: 1
    m._err = lambda rc: b"invalid value"
    m.max_pitch = 1 << 31
    src, dst = _pools("kv", 16, 0)
    with pytest.raises(RuntimeError, match=r"cudaMemcpy2DAsync of 3 slot\(s\) \(6 rows\): "
                                           r"invalid value \(error 1\)"):
        m.copy(Rows(src.buf, 2), Rows(dst.buf, 2), runs(np.arange(3), np.arange(3)), 0)


def test_no_runtime_is_loaded_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: tests/cache/test_gpu.py checks the loaded runtime")
    assert Memcpy2D.load("cuda") is None


@pytest.mark.parametrize("page", [1, 4])
def test_a_run_freed_comes_back_a_run_so_its_next_transfer_is_one_copy(page):
    """The allocator hands freed pages out again in the order they were freed: slots freed
    ascending come back ascending (before, the free stack reversed them, and a page-1 backup
    of a re-used run became one DMA a slot)."""
    from radixscope.cache.pools import SlotAllocator

    a = SlotAllocator("full/host", 64 * page, page)
    first = a.alloc(16 * page)
    assert runs(first, first).shape[0] == 1
    a.free(first)
    again = a.alloc(16 * page)
    assert torch.equal(again, first)
    b, c = a.alloc(8 * page), a.alloc(8 * page)
    a.free(b)
    a.free(c)
    assert torch.equal(a.alloc(8 * page), c) and torch.equal(a.alloc(8 * page), b)


def test_a_state_of_any_rank_backs_up_and_loads_back():
    """A MAMBA state of four dimensions: its pool's slots are dimension 0 whatever the rank
    (before, a five-dimensional state buffer was taken for KV, slots at dimension 2, and the
    transfer copied the wrong elements or failed)."""
    from radixscope.cache import HiRadixCache
    from tests.kits.cachekit import Driver, make_config

    c = HiRadixCache(make_config(("full", "mamba"), mamba_state_shape=(2, 3, 4, 5)))
    d = Driver(c)
    key = list(range(12))
    d.insert(key)
    c.poll(wait=True)
    c.evict(10**6, component="mamba")
    c.evict(10**6)
    lb = c.load_back(c.match_prefix(key))
    c.poll([lb.transfer_id], wait=True)
    assert d.verify_device_prefix(key, lb.anchor) == 12
    c.check()
