"""CUDA paths: device pools on the GPU, pinned host pools, transfers on a side stream with
events. Skipped without CUDA (see tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import HiRadixCache
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config

pytestmark = pytest.mark.gpu


def gpu_cache(components=("full",), **kw) -> tuple[HiRadixCache, Driver]:
    c = HiRadixCache(make_config(components, device="cuda", device_tokens=256, host_tokens=512,
                                 **kw))
    return c, Driver(c)


def test_pools_live_on_the_gpu_and_host_pools_are_pinned():
    c, _ = gpu_cache(("full", "swa", "mamba"))
    for dev, host in zip(c.device_pools, c.host_pools, strict=False):
        assert dev.buf.is_cuda
        assert not host.buf.is_cuda and host.buf.is_pinned()
    assert c.engine.cuda and c.engine.stream is not None


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_backup_and_load_back_round_trip_on_the_side_stream(components):
    c, d = gpu_cache(components)
    key = list(range(40))
    r = d.insert(key)
    assert r.backups and c.engine.pending[r.backups[0]][1] is not None  # a CUDA event
    assert c.poll(wait=True) == list(r.backups)
    c.evict(10**6)
    m = c.match_prefix(key)
    assert m.host_hit_length == 40
    lb = c.load_back(m)
    torch.cuda.synchronize()
    assert c.poll([lb.transfer_id], wait=True) == [lb.transfer_id]
    assert d.verify_device_prefix(key, lb.anchor) == 40
    c.check()


def test_poll_without_wait_acks_only_finished_transfers():
    c, d = gpu_cache()
    r = d.insert(list(range(64)))
    tid = r.backups[0]
    torch.cuda.current_stream().synchronize()
    c.engine.pending[tid][1].synchronize()
    assert c.poll() == [tid]
    c.check()
