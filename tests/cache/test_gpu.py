"""CUDA paths: device pools on the GPU, pinned host pools, transfers on a side stream with
events (one 2-D DMA a run of slots, or staged through pinned slabs), the match contract under
CUDA (the caller's stream waits on a load-back still in flight), and the fuzzer's content
checks with the copies on the GPU, on either path. Skipped without CUDA (see
tests/conftest.py); more of the staged path in tests/cache/test_gpu_staged.py."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.events import FlightRecorder
from radixscope.cache.staged import RUNS, STAGED
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, kv_for, make_config
from tests.kits.fuzzkit import Fuzzer

ALWAYS = 1 << 62  # a ``staged_below`` every copy is under

pytestmark = pytest.mark.gpu


def gpu_cache(components=("full",), **kw) -> tuple[HiRadixCache, Driver]:
    kw.setdefault("device_tokens", 256)
    kw.setdefault("host_tokens", 512)
    c = HiRadixCache(make_config(components, device="cuda", **kw))
    return c, Driver(c)


def test_pools_live_on_the_gpu_and_host_pools_are_pinned():
    c, _ = gpu_cache(("full", "swa", "mamba"))
    for dev, host in zip(c.device_pools, c.host_pools, strict=True):
        assert dev.buf.is_cuda
        assert not host.buf.is_cuda and host.buf.is_pinned()
    assert c.engine.cuda and c.engine.stream is not None
    assert c.engine.memcpy2d is not None, "the CUDA runtime's 2-D copy was not found"
    # the device's real limit (2 GiB - 1 on every CUDA GPU so far), not another attribute's
    assert c.engine.memcpy2d.max_pitch >= 1 << 30


def test_a_kv_pool_copies_its_runs_as_2d_copies_not_row_by_row():
    # regression: the max-pitch query asked for another attribute (27, a texture width of
    # 32 KiB), so every KV pool's pitch was "past the limit" and each run went row by row
    c, d = gpu_cache(("full",))
    force(c, "memcpy2d")
    r = d.insert(list(range(64)))
    assert c.poll(wait=True) == list(r.backups)
    m2d = c.engine.memcpy2d
    assert c.engine.copies[RUNS] >= 1 and m2d.row_copies == 0, m2d.max_pitch


def force(c: HiRadixCache, path: str) -> None:
    """Send every copy of ``c`` down ``path``: memcpy2d, rows (the per-row fallback of the
    runs) or staged."""
    c.engine.staged_below = ALWAYS if path == STAGED else 0
    if path == "rows":
        c.engine.memcpy2d = None


@pytest.mark.parametrize("path", ["memcpy2d", "rows", STAGED])
@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_backup_and_load_back_round_trip_on_the_side_stream(components, path):
    c, d = gpu_cache(components)
    force(c, path)
    key = list(range(40))
    r = d.insert(key)
    assert r.backups and c.engine.pending[r.backups[0]].event is not None  # a CUDA event
    assert c.poll(wait=True) == list(r.backups)
    c.evict(10**6)
    m = c.match_prefix(key)
    assert m.host_hit_length == 40
    lb = c.load_back(m)
    torch.cuda.synchronize()
    assert c.poll([lb.transfer_id], wait=True) == [lb.transfer_id]
    assert d.verify_device_prefix(key, lb.anchor) == 40
    c.check()
    on = c.engine.copies
    assert (on[STAGED] > 0, on[RUNS] > 0) == ((True, False) if path == STAGED else (False, True))


def test_poll_without_wait_acks_only_finished_transfers():
    c, d = gpu_cache()
    r = d.insert(list(range(64)))
    tid = r.backups[0]
    torch.cuda.current_stream().synchronize()
    c.engine.pending[tid].event.synchronize()
    assert c.poll() == [tid]
    c.check()


@pytest.mark.parametrize("path", ["memcpy2d", STAGED])
def test_a_transfer_ack_records_its_copy_time_on_the_side_stream(path):
    rec = FlightRecorder()
    c = HiRadixCache(make_config(("full",), device="cuda", device_tokens=256, host_tokens=512),
                     recorder=rec)
    force(c, path)
    d = Driver(c)
    key = list(range(64))
    d.insert(key)
    c.poll(wait=True)
    c.evict(10**6)
    c.poll([c.load_back(c.match_prefix(key)).transfer_id], wait=True)
    ops, _ = rec.tail()
    acks = [o for o in ops if o.op == ev.OP_TRANSFER]
    assert sorted(o.attrs[ev.A_TRANSFER_KIND] for o in acks) == ["backup", "load_back"]
    for o in acks:
        ns = o.attrs[ev.A_COPY_NS]
        assert 0 < ns <= o.end_ns - o.start_ns  # inside its submit-to-ack span
        assert o.attrs[ev.A_BYTES] == 64 * c.device_pools[0].bytes_per_slot


@pytest.mark.parametrize("path", ["memcpy2d", STAGED])
@pytest.mark.parametrize("page", [1, 16])
def test_a_match_during_a_load_back_reads_the_loaded_kv_on_the_callers_stream(page, path):
    """The contract of ``match_prefix`` under CUDA: the returned slots are readable by work the
    caller issues next on its stream, with the load-back still running (no poll, no sync).
    256 MB of KV keep the DMA busy for milliseconds, so a read that did not wait on the
    transfer's event sees the poison. Staged: the upload of the slab and the scatter after it
    are what the caller's stream must wait for."""
    n = 1024
    c, d = gpu_cache(layers=32, heads=8, head_dim=128, page_size=page, device_tokens=2 * n,
                     host_tokens=2 * n)
    force(c, path)
    key = list(range(n))
    d.insert(key)
    c.poll(wait=True)
    c.evict(10**6)
    c.device_pools[0].buf.fill_(-7.0)  # what an unlanded slot holds
    lb = c.load_back(c.match_prefix(key))
    assert lb.transfer_id is not None
    m = c.match_prefix(key)  # covers the nodes still loading
    assert m.device_prefix_len == n
    got = c.device_pools[0].buf.index_select(2, m.device_indices.cuda())  # the caller's stream
    want = kv_for(key, 0, n, (32, 8, 128))
    assert torch.equal(got.cpu(), want)
    c.poll(wait=True)
    c.check()


@pytest.mark.parametrize("path", [STAGED, RUNS])
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_fuzz_with_the_copies_on_the_gpu(components, page, path):
    """The CI fuzz profile's operations and content checks (every slot a match returns, every
    CoW, load-backs left in flight and polled out of order) on CUDA pools. Its shapes are
    tiny (64 B a FULL slot), so the default threshold stages every copy; a threshold of 0
    sends them all down the runs."""
    f = Fuzzer(components, page, "write_through", 21, device="cuda")
    if path == RUNS:
        f.c.engine.staged_below = 0
    stats = f.run(1500)
    assert (stats.violations, stats.mismatches) == (0, 0), stats.first_failure
    assert stats.ops == 1500 and stats.positions > 0
    on = f.c.engine.copies
    assert on[path] > 0 and on[STAGED if path == RUNS else RUNS] == 0, on
