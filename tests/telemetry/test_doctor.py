"""telemetry.analysis.doctor: the budget and integrity of a snapshot in plain words."""

from __future__ import annotations

import dataclasses

from radixscope.cache.snapshot import ComponentState, LockSnapshot, TransferSnapshot
from radixscope.telemetry.analysis.doctor import (
    budget_words,
    doctor_report,
    findings,
    lock_owners,
    pool_words,
)
from tests.kits.ui_snapshots import small_snapshot


def test_pool_words():
    s = small_snapshot()
    assert pool_words(s, s.pools[0]) == (
        "full/device: 32 tokens = 8 free (25%) + 10 evictable (31%; cached, unpinned, "
        "reclaimable on demand) + 12 protected (38%; pinned by 1 lock: req-a) + 2 held by "
        "running requests (6%). A new request can get up to 18 tokens here now (free + "
        "evictable).")
    assert pool_words(s, s.pools[1]) == (
        "full/host: 64 tokens = 45 free (70%) + 13 evictable (20%; cached, unpinned, reclaimable "
        "on demand) + 6 protected (9%; host copies referenced by transfers or prefetches; 6 of "
        "them in flight) + 0 held by running requests (0%). A new request can get up to 58 "
        "tokens here now (free + evictable).")
    assert budget_words(s)[4].startswith("mamba/device: 4 states = 2 free (50%)")
    assert len(budget_words(s)) == 6


def test_lock_owners_many():
    s = small_snapshot()
    locks = tuple(LockSnapshot(i, f"r{i}" if i % 2 else None, 3, "device", (("full", (3,)),))
                  for i in range(1, 8))
    s = dataclasses.replace(s, locks=locks)
    assert lock_owners(s, "full") == ["r1", "receipt 2", "r3", "receipt 4", "r5", "receipt 6",
                                      "r7"]
    assert lock_owners(s, "swa") == []
    assert "pinned by 7 locks: r1, receipt 2, r3, receipt 4, r5 and 2 more)" in \
        pool_words(s, s.pools[0])


SWA_KEPT = ("1 nodes (6 tokens) hold no swa data while their FULL KV stays on device (swa "
            "tombstones: its own pressure, or outside the window); they still serve the FULL "
            "prefix and an insert heals them")


def test_findings_on_a_broken_snapshot():
    s = small_snapshot()
    n = list(s.nodes)
    n[4] = dataclasses.replace(n[4], components=(ComponentState.on(),)
                               + n[4].components[1:])  # dead FULL
    n[6] = dataclasses.replace(n[6], parent_id=4)  # device data under host-only... now dead 4
    pools = (dataclasses.replace(s.pools[0], available=0, evictable=0, protected=20),
             dataclasses.replace(s.pools[1], in_flight=9)) + s.pools[2:]  # held 0 on host
    broken = dataclasses.replace(
        s, nodes=tuple(n), pools=pools,
        locks=s.locks + (LockSnapshot(8, "req-z", 99, "device", (("full", (99, 1)),)),),
        transfers=s.transfers + (TransferSnapshot(10, "load_back", 77, "device", (77,), ()),))
    got = [(f.severity, f.subject, f.message) for f in findings(broken)]
    assert got == [
        ("error", "full/host", "9 tokens in flight but only 6 protected and 0 held: a "
                               "transfer's destination slots are not pinned"),
        ("error", "lock 8", "lock of 'req-z' pins nodes that do not exist: [99]"),
        ("error", "transfer 10", "load_back transfer names nodes that do not exist: [77]"),
        ("error", "node 4", "FULL holds no data on either tier (a dead node left in the tree)"),
        ("error", "node 6", "FULL data on the device under parent 4, which is evicted from the "
                            "device (device prefix closure broken)"),
        ("warning", "full/device", "nothing free or evictable (20 protected, 12 held): the next "
                                   "allocation here fails"),
        ("info", "swa/device", SWA_KEPT),
    ]


def test_doctor_report():
    text = doctor_report(small_snapshot())
    lines = text.splitlines()
    assert lines[0] == ("cache at seq 40: 6 nodes, 1 locks, 1 transfers in flight; 0 errors, "
                        "0 warnings")
    assert lines[1] == f"  INFO swa/device: {SWA_KEPT}"
    assert lines[2] == "budget:"
    assert len(lines) == 9 and lines[3].startswith("  full/device: 32 tokens")
