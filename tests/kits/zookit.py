"""The bug zoo's engine runs: one run spec per crash class where its buggy variant fires, the
rule each is caught by, and the notebook runner the zoo tests share."""

from __future__ import annotations

import json
from pathlib import Path

from radixscope.engine.run import RunSpec

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "zoo"

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

# name -> (run settings, the rule that catches it, the op it is caught at)
ZOO = {
    "load_back_anchor": (_HYBRID, "load_back.anchor_accepted", "load_back"),
    "lock_evicted_segment": (_FULL_NO_LOAD, "full.pin_without_device", "lock"),
    "admission_swa_load_back": (_SWA_TIGHT, "admission.guarantee", "load_back"),
    "transfer_mutated": (_HYBRID, "full.host.slot_shared", "insert"),
    "ledger_twice": (_HYBRID, "full.device.evictable_ledger", "load_back"),
    "host_use_after_free": (_HYBRID_SMALL_HOST, "transfer.slot_freed", "insert"),
    "leaked_lock": (_HYBRID, "lock.released_at_request_end", None),
    "unlanded_read": (_HYBRID, "transfer.orphan_queued", "transfer"),
}
CLEAN = {"hybrid": _HYBRID, "hybrid-small-host": _HYBRID_SMALL_HOST,
         "full-no-load-back": _FULL_NO_LOAD, "swa-tight": _SWA_TIGHT}


def spec(settings: dict, store: Path | None) -> RunSpec:
    return RunSpec(store=None if store is None else str(store), telemetry_mode="inline",
                   **settings)


def record(name: str, facts: dict) -> None:
    """Keep what a zoo test measured (docs/zoo.md cites these files)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.json").write_text(json.dumps(facts, indent=1, sort_keys=True))
