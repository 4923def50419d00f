"""A real telemetry store for the UI tests: a HiRadixCache driven like a serving engine.

Multi-turn requests over three shared system prompts on a small device pool, so the store holds
evictions (host-only nodes), load-backs, admissions and refusals, an out-of-memory op, a lock
still held and a backup still in flight at the end, and one invariant violation recorded the
way an engine records a failed ``check()``.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from radixscope import telemetry
from radixscope.cache import CacheConfig, HiRadixCache, InvariantViolation
from radixscope.cache.errors import CacheOutOfMemory
from tests.kits.storage_records import StorageTap


def make_store(path: str | Path, preset: str = "hybrid", requests: int = 36,
               seed: int = 7, storage: bool = False) -> dict:
    """Write a store at ``path`` and return facts about the run (held lock, seqs...).
    ``storage``: the records carry L3 writes of every host copy (``storage_records``)."""
    tel = telemetry.setup(store=str(path), overwrite=True, mode="inline", keyframe_every=64,
                          sample_every_ms=0.0)
    cfg = CacheConfig.preset(preset, device_tokens=192, host_tokens=1024)
    tap = StorageTap(tel.recorder) if storage else None
    cache = HiRadixCache(cfg, recorder=tap or tel.recorder)
    rng = random.Random(seed)
    prompts = [list(range(1000 * (i + 1), 1000 * (i + 1) + 24)) for i in range(3)]
    history: list[list[int]] = []
    facts: dict = {"refused": [], "violation_seq": None, "held_lock": None, "in_flight": None}
    for r in range(requests):
        if history and rng.random() < 0.5:
            base = history[rng.randrange(len(history))]  # a follow-up turn
        else:
            base = prompts[r % 3]
        toks = base + [rng.randrange(50, 900) for _ in range(rng.randrange(6, 20))]
        keep_lock = r == requests - 1
        receipt = _serve(cache, tel, f"req-{r}", toks, keep_lock, facts)
        if receipt is not None:
            history.append(toks)
            if keep_lock:
                facts["held_lock"] = receipt
        if r == requests // 2:
            _record_violation(cache, tel, facts)
    try:  # a request asking for more than the pool: the alloc raises, recorded as an error op
        cache.alloc(10_000, req_id="req-oom")
    except CacheOutOfMemory:
        facts["oom"] = True
    big = _serve(cache, tel, "req-huge", prompts[0] + list(range(5000, 5400)), False, facts)
    assert big is None
    for toks in reversed(history):  # a load-back left unacked: nodes in flight at the end
        m = cache.match_prefix(toks, req_id="req-late")
        if m.host_hit_length > 0:
            facts["in_flight"] = cache.load_back(m, req_id="req-late").transfer_id
            break
    tel.flush()
    facts["last_seq"] = cache.snapshot().seq
    facts["snapshot"] = cache.snapshot()
    if tap is not None:  # the store's seqs are the tap's (store transfers added)
        facts["last_seq"] = tap.mutations[-1][0]
        facts["stores"] = tap.stores
    tel.close()
    return facts


def _serve(cache: HiRadixCache, tel, rid: str, toks: list[int], keep_lock: bool, facts: dict):
    m = cache.match_prefix(toks, req_id=rid)
    adm = cache.admission(m, len(toks) - m.device_prefix_len - m.host_hit_length)
    tel.record_admission(rid, adm.fits, **adm.as_dict())
    if not adm.fits:
        facts["refused"].append(rid)
        return None
    if m.host_hit_length > 0:
        lb = cache.load_back(m, req_id=rid)
        if lb.transfer_id is not None:
            cache.poll([lb.transfer_id], wait=True)
        m = cache.match_prefix(toks, req_id=rid)
    receipt = cache.lock(m.last_device_node, owner=rid, req_id=rid)
    n_new = len(toks) - m.device_prefix_len
    new = cache.alloc(n_new, req_id=rid)[:n_new]
    kw: dict = {}
    if "swa" in cache.ci:
        swa_new = cache.alloc(n_new, component="swa", req_id=rid)[:n_new]
        kw["swa_indices"] = torch.cat([torch.zeros(m.device_prefix_len, dtype=torch.int64),
                                       swa_new])
    if "mamba" in cache.ci:
        kw["mamba_slot"] = cache.alloc(1, component="mamba", req_id=rid)
    cache.insert(toks, torch.cat([m.device_indices, new]), prev_prefix_len=m.device_prefix_len,
                 req_id=rid, **kw)
    cache.poll(wait=True)
    if not keep_lock:
        cache.unlock(receipt, req_id=rid)
    return receipt


def _record_violation(cache: HiRadixCache, tel, facts: dict) -> None:
    """Break a ledger for one check, record the violation as an engine would, restore it."""
    cache.evictable[0][0] += 5
    try:
        cache.check()
    except InvariantViolation as e:
        tel.record_violation(str(e), details={"violations": [list(v) for v in e.violations]})
        facts["violation_seq"] = cache.snapshot().seq
        facts["violation_text"] = str(e)
    finally:
        cache.evictable[0][0] -= 5
