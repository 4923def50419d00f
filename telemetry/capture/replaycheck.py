"""Does a bundle's window replay to the cache's own state at the failure?

The cache's live snapshot reads its ledgers; a replay derives everything from the journal. The
two agree unless the cache changed state without recording it or its ledgers drifted, so a
bundle records the verdict and, per node and pool, where they differ. The same replay (through
``radixscope.telemetry.store.journal.Journal``) yields the pool figures after every op: the budget timeline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from radixscope.cache.events import OpRecord
from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.store.journal import Journal


def replay_check(start: CacheSnapshot | None, ops: Sequence[OpRecord],
                 mutations: Sequence[tuple], live: CacheSnapshot) -> tuple[list[tuple], dict]:
    """Replay a bundle's window.

    Args:
        start: the exact state before ``mutations`` (None: nothing to replay from).
        ops: the window's op records (their end times stamp the samples).
        mutations: the window's mutations, in seq order.
        live: the cache's own snapshot at the failure.

    Returns:
        ``(samples, verdict)``: metric rows ``(seq, ts_ns, component, tier, capacity, available,
        evictable, protected, in_flight)`` at the start and after every op's mutations, and
        ``{"ok", "why", "diff"}`` (``diff`` from ``snapshot_diff``; ``ok`` None without start).
    """
    if start is None:
        return [], {"ok": None, "why": "no keyframe at the window start", "diff": []}
    j = Journal(start, Health())
    end_ns = {o.op_id: o.end_ns for o in ops}
    ts = ops[0].start_ns if ops else time.time_ns()
    timeline = [(j.seq, ts, *p) for p in j.pools()]
    group: list[tuple] = []
    try:
        for m in [*mutations, None]:  # None flushes the last op's group
            if group and (m is None or m[1] != group[-1][1]):
                j.accept(group)
                ts = end_ns.get(group[-1][1], ts)  # an op older than the op ring: last time
                timeline += [(j.seq, ts, *p) for p in j.pools()]
                group = []
            if m is not None:
                group.append(m)
        got = j.snapshot()
    except Exception as e:  # noqa: BLE001 - a broken journal is a finding, not a crash
        return timeline, {"ok": False, "why": f"replay failed: {type(e).__name__}: {e}",
                          "diff": []}
    if got.seq != live.seq:
        return timeline, {"ok": False, "why": f"replay reaches seq {got.seq}, the failure is at "
                          f"seq {live.seq}", "diff": []}
    diff = snapshot_diff(got, live)
    return timeline, {"ok": not diff, "why": None if not diff else
                      "the replayed journal disagrees with the live cache", "diff": diff}


def snapshot_diff(replayed: CacheSnapshot, live: CacheSnapshot) -> list[list]:
    """``[[what, id, replayed, live], ...]`` for every node and pool that differs."""
    out: list[list] = []
    a = {n.node_id: n for n in replayed.nodes}
    b = {n.node_id: n for n in live.nodes}
    for nid in sorted(set(a) | set(b)):
        x, y = a.get(nid), b.get(nid)
        if x != y:
            out.append(["node", nid, _node_text(x), _node_text(y)])
    pa = {(p.component, p.tier): p for p in replayed.pools}
    for p in live.pools:
        q = pa.get((p.component, p.tier))
        if q != p:
            out.append(["pool", f"{p.component}/{p.tier}", _pool_text(q), _pool_text(p)])
    if replayed.locks != live.locks:
        out.append(["locks", None, len(replayed.locks), len(live.locks)])
    if replayed.transfers != live.transfers:
        out.append(["transfers", None, len(replayed.transfers), len(live.transfers)])
    return out


def _node_text(n: Any) -> str | None:
    if n is None:
        return None
    return (f"parent {n.parent_id} len {n.key_len} "
            + " ".join(f"[{c.device_len},{c.host_len},lock {c.lock_ref},href {c.host_ref}]"
                       for c in n.components))


def _pool_text(p: Any) -> str | None:
    if p is None:
        return None
    return (f"available {p.available} evictable {p.evictable} protected {p.protected} "
            f"in_flight {p.in_flight}")
