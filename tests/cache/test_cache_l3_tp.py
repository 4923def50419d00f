"""Two tensor-parallel ranks (gloo on 127.0.0.1, two processes) running the cache's L3 tier
with different backend delays and faults per rank: identical prefetch decisions (same poll
step, same tokens), identical trees (node keys and every tier's lengths, STORAGE included: the
store acks are agreed too), content verified after the round trip, no hang (bounded)."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

from tests.kits.storagekit import run_two_ranks

SCENARIOS = {  # name -> (policy, components, {rank: FaultyBackend kwargs})
    "wait_complete_slow_rank1": ("wait_complete", ("full", "swa", "mamba"), {1: {"delay": 0.02}}),
    "timeout_hybrid_slow_rank0": ("timeout", ("full", "swa"), {0: {"delay": 0.02}}),
    "best_effort_slow_rank0": ("best_effort", ("full",), {0: {"delay": 0.03}}),
    "timeout_rank1_faulty": ("timeout", ("full", "mamba"),
                             {1: {"delay": 0.01, "failure_rate": 0.3}}),
}


def _tree(cache) -> list:
    return [[n.node_id, n.parent_id, list(n.tokens), [list(s.lens) for s in n.components]]
            for n in cache.snapshot().nodes]


def _rank_main(rank: int, port: int, root: str, out: str) -> None:
    import torch.distributed as dist

    from radixscope.cache import HiRadixCache
    from radixscope.cache.storage import (
        FaultyBackend,
        FileBackend,
        PrefetchConfig,
        StorageSetup,
        TorchRankGroup,
    )
    from tests.kits.cachekit import Driver, make_config
    from tests.kits.l3kit import evict_everything

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=30))
    group, io_group = TorchRankGroup.new(), TorchRankGroup.new()
    log = []
    for name, (policy, comps, faults) in SCENARIOS.items():
        backend = FaultyBackend(FileBackend(Path(root) / f"{name}-r{rank}"), seed=3, rank=rank,
                                **faults.get(rank, {}))
        pf = PrefetchConfig(policy=policy, threshold_tokens=4, batch_pages=2,
                            timeout_base_s=0.2, timeout_per_ki_token_s=0.0, max_host_share=1.0)
        c = HiRadixCache(make_config(comps, page_size=2, host_tokens=256),
                         storage=StorageSetup(backend, prefetch=pf, group=group,
                                              io_group=io_group))
        d = Driver(c)
        toks = list(range(50, 90))
        d.insert(toks[:8])
        d.insert(toks)
        c.poll(wait=True)
        c.check()
        written = _tree(c)
        evict_everything(c)
        d.insert(toks[:8])
        c.poll(wait=True)
        m = c.match_prefix(toks, req_id="r", prefetch=True)
        steps, t0 = 0, time.monotonic()
        while c.prefetch_state("r").status == "ongoing" and time.monotonic() - t0 < 20:
            c.poll()
            c.check()
            steps += 1
            time.sleep(0.001)
        st = c.prefetch_state("r")
        m2 = c.match_prefix(toks, req_id="r", prefetch=True)
        lb = c.load_back(m2)
        c.poll(wait=True)
        d.verify_device_prefix(toks, lb.anchor)
        c.check()
        log.append({"name": name, "started": m.prefetch_status, "steps": steps,
                    "state": [st.status, st.hit_tokens], "reason": st.reason,
                    "storage_hit": m2.storage_hit_length, "written": written, "tree": _tree(c)})
        c.close()
    Path(out).write_text(json.dumps(log))
    dist.destroy_process_group()


def test_two_ranks_same_decisions_same_trees_no_hang(tmp_path: Path) -> None:
    logs = run_two_ranks("tests.cache.test_cache_l3_tp", tmp_path)
    for a, b in zip(*logs, strict=True):
        ra, rb = a.pop("reason"), b.pop("reason")  # why: each rank's own view of the failure
        assert a == b, (a["name"], a, b)  # same decisions, same step, same trees
        assert (ra == rb) or a["name"] == "timeout_rank1_faulty", (ra, rb)
    by = {e["name"]: e for e in logs[0]}
    assert by["wait_complete_slow_rank1"]["state"] == ["done", 32]
    assert by["wait_complete_slow_rank1"]["storage_hit"] == 32
    assert by["best_effort_slow_rank0"]["steps"] == 1  # stopped at the first poll, on both
    for e in logs[0]:
        assert e["started"] == "started"
        stored = [n for n in e["written"] if n[1] is not None and n[3][0][2] is not None]
        if e["name"] != "timeout_rank1_faulty":
            assert stored, e["name"]  # the clean scenarios wrote to L3 on both ranks
