"""Two tensor-parallel ranks (gloo on 127.0.0.1, two processes) prefetching with different
timings and different stores: identical decisions (same poll step, same tokens, same starts) on
both ranks, and no hang (each run bounded)."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

from tests.kits.storagekit import run_two_ranks

SCENARIOS = {  # name -> (policy, pools, {rank: FaultyBackend kwargs}, {rank: stored pages})
    "wait_complete_slow_rank1": ("wait_complete", ("swa", "mamba"), {1: {"delay": 0.02}}, {}),
    "best_effort_slow_rank0": ("best_effort", (), {0: {"delay": 0.03}}, {}),
    "timeout_slow_rank1": ("timeout", ("swa",), {1: {"delay": 0.05}}, {}),
    "min_of_stores": ("wait_complete", ("swa", "mamba"), {0: {"delay": 0.01}}, {1: 10}),
    "rank1_get_fails": ("wait_complete", (), {1: {"get_failure_rate": 0.2}}, {}),
    "rank0_no_host_room": ("wait_complete", (), {}, {}),
}


def _rank_main(rank: int, port: int, root: str, out: str) -> None:
    import torch.distributed as dist

    from radixscope.cache.storage import FaultyBackend, PrefetchConfig, StopPolicy, TorchRankGroup
    from tests.kits.prefetchkit import P, Rig

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=30))
    group, io_group = TorchRankGroup.new(), TorchRankGroup.new()
    log = []
    for name, (policy, aux, faults, stored) in SCENARIOS.items():
        rig = Rig(Path(root) / f"{name}-r{rank}", aux, seed=rank)
        rig.write(pages=stored.get(rank))
        backend = FaultyBackend(rig.store, seed=7, rank=rank, **faults.get(rank, {}))
        cfg = PrefetchConfig(policy=StopPolicy(policy), threshold_tokens=2 * P, batch_pages=2,
                             timeout_base_s=0.1, timeout_per_ki_token_s=0.0)
        ctl = rig.controller(backend, cfg, group=group, io_group=io_group)
        if name == "rank0_no_host_room" and rank == 0:
            rig.alloc["full"].alloc(60 * P)
        started = ctl.start("r", rig.hashes)
        step, got = 0, []
        t0 = time.monotonic()
        while ctl.ongoing("r") and time.monotonic() - t0 < 20:
            got += ctl.poll()
            ctl.check()
            step += 1
            time.sleep(0.001)
        for r in got:
            rig.verify(r)
            rig.free(r)
        ctl.close()
        log.append({"name": name, "started": [started.started, started.reason], "step": step,
                    "tokens": [r.tokens for r in got], "hit": [r.hit_tokens for r in got],
                    "stats": [ctl.stats().prefetched_tokens, ctl.stats().hit_tokens],
                    "calls": [group.calls, io_group.calls]})
    Path(out).write_text(json.dumps(log))
    dist.destroy_process_group()


def test_two_ranks_agree_and_never_hang(tmp_path: Path) -> None:
    logs = run_two_ranks("tests.cache.test_cache_storage_prefetch_tp", tmp_path)
    for a, b in zip(*logs, strict=True):
        assert a == b, (a, b)  # same starts, same poll step, same tokens, same collective counts
    by = {e["name"]: e for e in logs[0]}
    assert by["wait_complete_slow_rank1"]["tokens"] == [64]
    assert by["min_of_stores"]["tokens"] == [40] and by["min_of_stores"]["hit"] == [40]
    assert by["rank0_no_host_room"]["started"] == [False, "host_capacity"]
    assert by["best_effort_slow_rank0"]["step"] == 1  # stopped at the first poll, on both ranks
