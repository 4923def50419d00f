"""Staged copies (``cache/staged.py``): the choice between runs and staging, the reused slabs,
and a stage's gather / bulk copy / scatter, run on the CPU (the same torch calls the side
stream runs under CUDA; the CUDA side is in tests/cache/test_gpu_staged.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixscope.cache.copy_runs import runs
from radixscope.cache.pools import KVPool, StatePool
from radixscope.cache.staged import (
    RUNS,
    STAGED,
    STAGED_BELOW_BYTES,
    Stage,
    StagingSlabs,
    copy_path,
)

CPU = torch.device("cpu")


def test_the_default_threshold_is_32_kib():
    assert STAGED_BELOW_BYTES == 32 * 1024


@pytest.mark.parametrize("itemsize", [1, 2, 4])
def test_no_staged_slot_reaches_the_cpu_gathers_one_thread_size(itemsize):
    """The CPU gather (``index_select``) drops to fewer threads once a slot reaches 32,768
    elements, and a staged load-back with it (4x slower on an H200's host, bench/RESULTS.md,
    third GPU session): the default threshold keeps every staged slot below, fp8 included."""
    grain = 32768  # elements a slot
    one_slot_runs = np.array([[2 * i, i, 1] for i in range(8)])
    assert copy_path(one_slot_runs, grain * itemsize, STAGED_BELOW_BYTES) == RUNS
    small = min(grain * itemsize, STAGED_BELOW_BYTES) - itemsize
    assert copy_path(one_slot_runs, small, STAGED_BELOW_BYTES) == STAGED


@pytest.mark.parametrize(("slots_a_run", "bytes_per_slot", "want"), [
    (1, 256, STAGED),        # the default preset, page 1, scattered: 256 B a run
    (127, 256, STAGED),      # 32,512 B a run
    (128, 256, RUNS),        # 32,768 B a run: not below
    (1, 128 * 1024, RUNS),   # a real model's token: 128 KiB, one slot a run is enough
    (16, 2048, RUNS),        # a page of 16 at 2 KiB a slot
])
def test_a_copy_goes_staged_when_its_runs_average_under_the_threshold(slots_a_run,
                                                                      bytes_per_slot, want):
    n_runs = 10
    src = np.concatenate([np.arange(100 * r, 100 * r + slots_a_run) for r in range(n_runs)])
    table = runs(src, np.arange(src.size))
    assert len(table) == n_runs
    assert copy_path(table, bytes_per_slot, STAGED_BELOW_BYTES) == want


def test_the_mean_decides_not_the_shortest_run():
    table = np.array([[0, 0, 1], [10, 1, 1], [20, 2, 1000]])  # 1002 slots in 3 runs
    assert copy_path(table, 256, 32 * 1024) == RUNS  # 85,504 B a run on average
    assert copy_path(table, 64, 32 * 1024) == STAGED  # 21,376 B


def test_nothing_to_copy_or_a_zero_threshold_takes_the_runs():
    assert copy_path(np.empty((0, 3), dtype=np.int64), 256, STAGED_BELOW_BYTES) == RUNS
    assert copy_path(np.array([[0, 0, 1]]), 4, 0) == RUNS


def test_slabs_are_reused_the_smallest_that_fits_first():
    s = StagingSlabs(pin=False, keep=2)
    a = s.take(10)
    b = s.take(200_000)
    assert (a.numel(), b.numel(), s.made) == (1 << 16, 7 << 15, 2)  # 229,376 >= 200,000
    c = s.take(10)  # a and b are handed out: a third slab
    assert s.made == 3 and c.data_ptr() not in (a.data_ptr(), b.data_ptr())
    s.give(b)
    s.give(a)
    assert s.take(100).data_ptr() == a.data_ptr()  # the smaller one that fits
    assert s.take(100_000).data_ptr() == b.data_ptr()
    assert s.made == 3
    s.give(a)
    s.give(b)
    s.give(c)  # past keep=2: the smallest is dropped
    assert sorted(x.numel() for x in s.free) == [1 << 16, 7 << 15]


def _pool(kind: str, slots: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    if kind == "kv":
        p = KVPool("p", 3, slots, 2, 5, dtype, "cpu", 1)
    elif kind == "state":
        p = StatePool("p", slots, (7,), dtype, "cpu")
    else:  # a state of rank 3 (conv + ssm shapes): slots along dim 0 of a 4-D buffer
        p = StatePool("p", slots, (2, 3, 4), dtype, "cpu")
    p.buf.copy_(torch.rand(p.buf.shape, generator=g).to(dtype))
    return p


def _scattered(slots: int, n: int, rng: np.random.Generator) -> torch.Tensor:
    return torch.from_numpy(rng.permutation(slots)[:n].astype(np.int64))


KINDS = ["kv", "state", "state4d"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _copy_case(kind: str, dtype: torch.dtype, seed: int, src_slots: int, dst_slots: int, n: int,
               to_host: bool):
    """A pool pair, ``n`` scattered slots of each, what a gather and scatter would leave in the
    destination, and a stage of that copy started on fresh slabs (CPU: its copies run)."""
    rng = np.random.default_rng(seed)
    src = _pool(kind, src_slots, dtype, 2 * seed + 1)
    dst = _pool(kind, dst_slots, dtype, 2 * seed + 2)
    s_idx, d_idx = _scattered(src_slots, n, rng), _scattered(dst_slots, n, rng)
    want = dst.buf.clone()
    want.index_copy_(dst.slot_dim, d_idx, src.buf.index_select(src.slot_dim, s_idx))
    before = dst.buf.clone()
    slabs = StagingSlabs(pin=False)
    st = Stage(to_host=to_host)
    st.add(src.buf, dst.buf, src.slot_dim, s_idx, d_idx)
    st.start(slabs, CPU)
    return dst, want, before, slabs, st


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_a_staged_backup_lands_in_the_host_pool_only_at_finish(kind, dtype):
    host, want, before, slabs, st = _copy_case(kind, dtype, 0, 64, 96, 23, to_host=True)
    assert torch.equal(host.buf, before)  # the scatter waits for the event: finish
    assert slabs.free == []
    st.finish(slabs)
    assert torch.equal(host.buf, want)
    assert len(slabs.free) == 1
    st.finish(slabs)  # once: a second finish does nothing
    assert len(slabs.free) == 1 and torch.equal(host.buf, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_a_staged_load_back_writes_exactly_the_slots_a_gather_and_scatter_would(kind, dtype):
    dev, want, _, slabs, st = _copy_case(kind, dtype, 1, 96, 64, 31, to_host=False)
    assert torch.equal(dev.buf, want)  # CPU: the stream's copies ran at once
    st.finish(slabs)
    assert torch.equal(dev.buf, want) and len(slabs.free) == 1


@pytest.mark.parametrize("to_host", [True, False], ids=["backup", "load_back"])
def test_one_stage_carries_every_component_of_a_transfer_through_one_slab(to_host):
    """FULL and SWA KV of bf16 and a float32 MAMBA state in one slab: each region aligned for
    its dtype, none overlapping another."""
    rng = np.random.default_rng(2)
    pairs = [(_pool("kv", 40, torch.bfloat16, 5), _pool("kv", 50, torch.bfloat16, 6)),
             (_pool("kv", 40, torch.bfloat16, 7), _pool("kv", 50, torch.bfloat16, 8)),
             (_pool("state4d", 40, torch.float32, 9), _pool("state4d", 50, torch.float32, 10))]
    st, wants = Stage(to_host), []
    for k, (a, b) in enumerate(pairs):
        src, dst = (a, b) if to_host else (b, a)
        n = 5 + 7 * k
        s_idx = _scattered(src.buf.shape[src.slot_dim], n, rng)
        d_idx = _scattered(dst.buf.shape[dst.slot_dim], n, rng)
        want = dst.buf.clone()
        want.index_copy_(src.slot_dim, d_idx, src.buf.index_select(src.slot_dim, s_idx))
        wants.append((dst, want))
        st.add(src.buf, dst.buf, src.slot_dim, s_idx, d_idx)
    slabs = StagingSlabs(pin=False)
    st.start(slabs, CPU)
    st.finish(slabs)
    for dst, want in wants:
        assert torch.equal(dst.buf, want)
    assert slabs.made == 1


def test_stages_in_flight_at_once_each_hold_their_own_slab_and_finish_in_any_order():
    rng = np.random.default_rng(3)
    dev, host = _pool("kv", 256, torch.float32, 11), _pool("kv", 256, torch.float32, 12)
    free = rng.permutation(256)
    slabs = StagingSlabs(pin=False)
    for _round in range(2):
        stages, wants, off = [], [], 0
        for n in (40, 3, 64, 17):  # distinct host slots per stage, as the allocator gives
            s_idx = _scattered(256, n, rng)
            d_idx = torch.from_numpy(free[off:off + n].astype(np.int64))
            off += n
            st = Stage(to_host=True)
            st.add(dev.buf, host.buf, 2, s_idx, d_idx)
            st.start(slabs, CPU)
            stages.append(st)
            wants.append((d_idx, dev.buf.index_select(2, s_idx)))
        assert len({s.slab.data_ptr() for s in stages}) == 4  # no slab shared in flight
        for i in (2, 0, 3, 1):
            stages[i].finish(slabs)
        for d_idx, data in wants:
            assert torch.equal(host.buf.index_select(2, d_idx), data)
        assert slabs.made == 4  # the second round reuses the first round's slabs
