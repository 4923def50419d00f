"""The staged copy path under CUDA (``cache/staged.py`` run by ``TransferEngine``): content
through backups and load-backs with several transfers in flight at once on fragmented pools
(each holds its own pinned slab until its event), every component set, a transfer whose copies
take both paths, a backup's host data before its ack, and the stand-in model's pinned uploads.
Skipped without CUDA (see tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache.staged import RUNS, STAGED
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, kv_for, make_config

pytestmark = pytest.mark.gpu

# the bench's fragmenting of a pool (its free pages handed back shuffled), so both shuffle alike
_spec = importlib.util.spec_from_file_location(
    "bench_gpu", Path(__file__).resolve().parents[2] / "bench" / "bench_gpu.py")
bench_gpu = importlib.util.module_from_spec(_spec)
sys.modules["bench_gpu"] = bench_gpu
_spec.loader.exec_module(bench_gpu)

KEYS = 6  # transfers in flight at once
LEN = 40  # tokens a key


def staged_cache(components, page: int = 1, fragmented: bool = True, **kw
                 ) -> tuple[HiRadixCache, Driver]:
    kw.setdefault("device_tokens", 512)
    kw.setdefault("host_tokens", 1024)
    c = HiRadixCache(make_config(components, device="cuda", page_size=page,
                                 mamba_slots=32, mamba_host_slots=64, **kw))
    if fragmented:
        rng = torch.Generator().manual_seed(7)
        for pool in (*c.device_pools, *c.host_pools):
            bench_gpu.shuffle_free_list(pool.alloc, rng)
    return c, Driver(c)


def _keys() -> list[list[int]]:
    return [[1000 * (k + 1) + i for i in range(LEN)] for k in range(KEYS)]  # disjoint


def _host_matches_device(c: HiRadixCache, key: list[int], node_id: int) -> None:
    """Every component's host copy on the path to ``node_id`` equals its device copy."""
    for x in c.tree.path_to_root(c.node(node_id)):
        for ci, d in enumerate(x.data):
            dv, hv = d.values[Tier.DEVICE], d.values[Tier.HOST]
            if dv is not None and hv is not None:
                got = c.host_pools[ci].read(hv)
                want = c.device_pools[ci].read(dv).cpu()
                assert torch.equal(got, want), f"node {x.id} component {ci}: host != device"


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_several_staged_transfers_in_flight_round_trip_on_fragmented_pools(components, page):
    c, d = staged_cache(components, page)
    keys = _keys()
    backups = [tid for k in keys for tid in d.insert(k).backups]  # none polled yet
    assert len(backups) >= KEYS and set(backups) <= set(c.engine.pending)
    staged = [p.stages for p in c.engine.pending.values() if p.stages]
    assert len(staged) == len(backups) and all(len(s) == 1 for s in staged)
    assert len({s[0].slab.data_ptr() for s in staged}) == len(staged)  # one slab each
    order = list(backups)
    random.Random(page).shuffle(order)
    assert c.poll(order, wait=True) == order
    for k in keys:
        _host_matches_device(c, k, c.match_prefix(k).last_device_node)
    c.check()
    made = c.engine.slabs.made
    assert made == len(backups)  # one slab a transfer in flight

    c.evict(10**6)
    loads = []
    for k in keys:  # every load-back submitted before any is polled
        m = c.match_prefix(k)
        assert m.host_hit_length == LEN
        lb = c.load_back(m)
        loads.append((k, lb))
    ids = [lb.transfer_id for _, lb in loads]
    assert len({c.engine.pending[t].stages[0].slab.data_ptr() for t in ids}) == KEYS
    for k, _lb in loads[::2]:  # the match contract: read before any poll
        m = c.match_prefix(k)
        if components == ("full",):
            assert m.device_prefix_len == LEN
        got = c.device_pools[0].buf.index_select(2, m.device_indices.cuda())  # caller's stream
        assert torch.equal(got.cpu(), kv_for(k, 0, m.device_prefix_len, d._shape(0)))
        assert d.verify_device_prefix(k, m.last_device_node) == m.device_prefix_len
    random.Random(page + 1).shuffle(ids)
    assert c.poll(ids, wait=True) == ids
    for k, lb in loads:
        assert d.verify_device_prefix(k, lb.anchor) == LEN
    c.check()
    on = c.engine.copies
    assert on[STAGED] > 0 and on[RUNS] == 0, on
    assert c.engine.slabs.made == made  # the load-backs took the slabs the backups gave back
    assert len(c.engine.slabs.free) == min(made, c.engine.slabs.keep)


def test_a_transfer_can_send_one_component_staged_and_another_down_the_runs():
    """Contiguous pools: FULL's 40-slot run (2,560 B) goes down the runs, MAMBA's one 12 B
    state and SWA's short window staged, in the same transfers."""
    c, d = staged_cache(("full", "swa", "mamba"), fragmented=False)
    c.engine.staged_below = 1024
    key = _keys()[0]
    d.insert(key)
    c.poll(wait=True)
    _host_matches_device(c, key, c.match_prefix(key).last_device_node)
    c.evict(10**6)
    lb = c.load_back(c.match_prefix(key))
    c.poll([lb.transfer_id], wait=True)
    assert d.verify_device_prefix(key, lb.anchor) == LEN
    on = c.engine.copies
    assert on[STAGED] > 0 and on[RUNS] > 0, on
    c.check()


def test_make_ready_on_a_staged_backup_lands_its_host_data_before_the_ack():
    c, d = staged_cache(("full",))
    key = _keys()[0]
    (tid,) = d.insert(key).backups
    c.engine.make_ready(c, tid)
    assert c.engine.pending[tid].stages[0].slab is None  # scattered, slab given back
    _host_matches_device(c, key, c.match_prefix(key).last_device_node)
    assert c.poll([tid], wait=True) == [tid]  # the ack scatters nothing twice
    _host_matches_device(c, key, c.match_prefix(key).last_device_node)
    c.check()


def test_a_staged_load_back_leaves_its_pinned_slab_unwritten_until_its_event():
    """The host pool is gathered into the slab at submit; with the side stream held back, the
    next load-back takes another slab, and what lands is what was gathered."""
    c, d = staged_cache(("full",), layers=8, heads=8, head_dim=64)
    c.engine.staged_below = 1 << 62  # 32 KiB a slot: staged whatever the runs
    keys = _keys()[:2]
    for k in keys:
        d.insert(k)
    c.poll(wait=True)
    c.evict(10**6)
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(c.engine.stream):
        torch.cuda._sleep(200_000_000)  # keep the side stream busy (a fraction of a second)
    a = c.load_back(c.match_prefix(keys[0]))
    b = c.load_back(c.match_prefix(keys[1]))
    pa, pb = c.engine.pending[a.transfer_id], c.engine.pending[b.transfer_id]
    assert not pa.event.query()
    assert pa.stages[0].slab.data_ptr() != pb.stages[0].slab.data_ptr()
    c.poll(wait=True)
    for k, lb in zip(keys, (a, b), strict=True):
        assert d.verify_device_prefix(k, lb.anchor) == LEN
    c.check()


def test_the_model_uploads_reuse_pinned_buffers_only_after_their_copies_ran():
    """A busy stream: every upload queues behind the sleep, the ring wraps several times, and
    each device tensor still holds what was given."""
    from radixscope.engine.uploads import PinnedUploads

    up = PinnedUploads(torch.device("cuda"), slots=2)
    torch.cuda._sleep(100_000_000)
    srcs = [torch.arange(i, i + 1000, dtype=torch.int64).view(-1, 2) for i in range(7)]
    outs = [up.put(s) for s in srcs]
    for s, o in zip(srcs, outs, strict=True):
        assert o.is_cuda and torch.equal(o.cpu(), s)
    assert torch.equal(up.put(outs[0]), outs[0])  # already there: no upload

