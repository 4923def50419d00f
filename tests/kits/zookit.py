"""The bug zoo's engine runs: one run spec per crash class where its buggy variant fires, the
rule each is caught by, and the notebook runner the zoo tests share."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from radixscope.engine.run import RunSpec, execute

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "zoo"
L3_STORE = "file:<next to the run's store>"  # ``spec`` puts the run's L3 directory here
L3_COLD = "file:<next to the run's store, empty>"  # the same, with no warm-up run

_HYBRID = dict(workload="chat", preset="hybrid", requests=20,
               sizes=dict(device_tokens=1024, host_tokens=2048, swa_device_tokens=512,
                          swa_host_tokens=512, mamba_slots=16, mamba_host_slots=16))
_HYBRID_SMALL_HOST = dict(_HYBRID, sizes=dict(_HYBRID["sizes"], host_tokens=4096,
                                              swa_host_tokens=128, mamba_host_slots=2))
_FULL_NO_LOAD = dict(workload="chat", preset="full", requests=20, load_back_threshold=100_000,
                     sizes=dict(device_tokens=1024, host_tokens=2048))
_SWA_TIGHT = dict(workload="chat", preset="swa", requests=20, chunk_tokens=64,
                  prefill_budget=128, sizes=dict(device_tokens=2048, host_tokens=4096,
                                                 swa_device_tokens=256, swa_host_tokens=1024))

# L3: a file store that a first (clean) run of the same workload filled, so the second run's
# requests prefetch from it (``prepare``); hybrid, so every prefetch has pool transfers
_L3_HYBRID = dict(workload="chat", preset="hybrid", requests=20, storage=L3_STORE,
                  prefetch_policy="wait_complete", prefetch_threshold=16,
                  sizes=dict(device_tokens=2048, host_tokens=4096, swa_device_tokens=512,
                             swa_host_tokens=512, mamba_slots=16, mamba_host_slots=16))

# class 3 as it shipped: an L3 tier whose prefetches host-pin their anchors; fewshot (shared
# prefixes forking), write_back, host and the auxiliary host pools tight
_L3_FEWSHOT = dict(workload="fewshot", preset="hybrid", requests=100, write_policy="write_back",
                   storage=L3_COLD, prefetch_policy="wait_complete", prefetch_threshold=16,
                   sizes=dict(device_tokens=2048, host_tokens=2048, swa_device_tokens=512,
                              swa_host_tokens=128, mamba_slots=16, mamba_host_slots=2))

# name -> (run settings, the rule that catches it, the op it is caught at)
ZOO = {
    "load_back_anchor": (_HYBRID, "load_back.anchor_accepted", "load_back"),
    "lock_evicted_segment": (_FULL_NO_LOAD, "full.pin_without_device", "lock"),
    "admission_swa_load_back": (_SWA_TIGHT, "admission.guarantee", "load_back"),
    "transfer_mutated": (_HYBRID, "full.host.slot_shared", "insert"),
    "ledger_twice": (_HYBRID, "full.device.evictable_ledger", "insert"),
    "host_use_after_free": (_HYBRID_SMALL_HOST, "transfer.slot_freed", "insert"),
    "leaked_lock": (_HYBRID, "lock.released_at_request_end", None),
    "unlanded_read": (_HYBRID, "transfer.orphan_queued", "transfer"),
    "prefetch_pool_pending": (_L3_HYBRID, "prefetch.terminated_pool_pending", "prefetch"),
    # the op that deletes the pinned anchor: a prefetch start's or an alloc's host eviction
    "tombstone_cascade": (_L3_FEWSHOT, "lock.dead_pin", None),
}
CLEAN = {"hybrid": _HYBRID, "hybrid-small-host": _HYBRID_SMALL_HOST,
         "full-no-load-back": _FULL_NO_LOAD, "swa-tight": _SWA_TIGHT, "l3-hybrid": _L3_HYBRID,
         "l3-fewshot-write-back": _L3_FEWSHOT}


def spec(settings: dict, store: Path) -> RunSpec:
    """The run's spec; an L3 run's file store is ``<store dir>/l3``."""
    if settings.get("storage") in (L3_STORE, L3_COLD):
        settings = dict(settings, storage=f"file:{store.parent / 'l3'}")
    return RunSpec(store=str(store), telemetry_mode="inline", **settings)


def prepare(settings: dict, store: Path) -> None:
    """Before an L3 run: a clean run of the same workload (its own store) fills the L3 store,
    so the run's requests find their prefixes there and prefetch them."""
    if settings.get("storage") != L3_STORE:
        return
    warm = execute(replace(spec(settings, store), store=str(store.parent / "warm.db")))
    assert warm.ok, warm.error
    assert warm.cache.cache.storage_stats().writes.pages_stored > 0


def record(name: str, facts: dict) -> None:
    """Keep what a zoo test measured (docs/zoo.md cites these files)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.json").write_text(json.dumps(facts, indent=1, sort_keys=True))
