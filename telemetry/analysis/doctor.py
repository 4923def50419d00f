"""The budget doctor: a snapshot's pools and integrity explained in plain words.

Pure functions over a ``CacheSnapshot`` (live, replayed with ``state_at`` or from a crash
bundle), shared by ``radixscope doctor`` and the UI's Health page so both say the same thing.

Every pool splits as ``capacity = free + evictable + protected + held``: *evictable* is cached
data nobody pins, *protected* is pinned by locks (device) or host references (host), *held* is
what running requests own outside the tree. What is *in flight* (a copy not acked yet) is
pinned, so it lies in *protected* (tree nodes) or *held* (a request's private slot, e.g. a
MAMBA copy-on-write load-back). A negative *held* means some slots are counted twice.

An external engine's store (``radixscope watch``) knows the engine's blocks but not its pool
sizes (``info["cache"]["pools"]`` is empty, the snapshot's capacities 0; see
``pool_sizes_known``): with ``pools_known=False`` the budget says the capacity is unknown and
the capacity checks are skipped, while the blocks in the tree are still counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixscope.cache import events as ev
from radixscope.cache.components import rules
from radixscope.cache.snapshot import CacheSnapshot, PoolSnapshot

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``severity`` (error / warning / info), ``subject`` (a pool like
    ``full/device``, or ``node 12``), ``message`` (a sentence with the numbers)."""

    severity: str
    subject: str
    message: str


def unit_of(component: str) -> str:
    """What one slot of ``component``'s pools holds (``states`` for MAMBA, else ``tokens``):
    the component's own answer."""
    return rules(component).unit


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "-"


def lock_owners(snap: CacheSnapshot, component: str) -> list[str]:
    """Owners (or ``receipt N``) of device locks pinning ``component``, in receipt order."""
    out = []
    for lk in snap.locks:
        if lk.tier == ev.TIER_DEVICE and any(c == component and ids for c, ids in lk.pins):
            out.append(lk.owner or f"receipt {lk.receipt_id}")
    return out


def pool_sizes_known(info: dict) -> bool:
    """Whether a store's ``info`` gives the pool capacities: not for an external engine
    (``info["cache"]`` with ``external`` true, or its ``pools`` empty)."""
    cache = info.get("cache")
    return not (isinstance(cache, dict)
                and (cache.get("external") is True or cache.get("pools") == {}))


def pool_words(snap: CacheSnapshot, pool: PoolSnapshot, pools_known: bool = True) -> str:
    """One pool's budget as a sentence, e.g. ``full/device: 256 tokens = 16 free (6%) + ...``;
    with ``pools_known=False``, what the tree holds there and that the capacity is unknown."""
    u = unit_of(pool.component)
    if not pools_known:
        return (f"{pool.component}/{pool.tier}: capacity unknown; the tree holds "
                f"{pool.evictable + pool.protected} {u} here ({pool.evictable} evictable, "
                f"{pool.protected} protected).")
    cap = pool.capacity
    parts = [f"{pool.available} free ({_pct(pool.available, cap)})",
             f"{pool.evictable} evictable ({_pct(pool.evictable, cap)}; cached, unpinned, "
             "reclaimable on demand)"]
    prot = f"{pool.protected} protected ({_pct(pool.protected, cap)}"
    if pool.tier == ev.TIER_DEVICE:
        owners = lock_owners(snap, pool.component)
        if owners:
            shown = ", ".join(owners[:5]) + (f" and {len(owners) - 5} more" if len(owners) > 5
                                             else "")
            prot += f"; pinned by {len(owners)} lock{'s' if len(owners) != 1 else ''}: {shown}"
    else:
        prot += "; host copies referenced by transfers or prefetches"
    if pool.in_flight:
        prot += f"; {pool.in_flight} of them in flight"
    parts.append(prot + ")")
    parts.append(f"{pool.held} held by running requests ({_pct(pool.held, cap)})")
    grab = pool.available + pool.evictable
    return (f"{pool.component}/{pool.tier}: {cap} {u} = " + " + ".join(parts)
            + f". A new request can get up to {grab} {u} here now (free + evictable).")


def budget_words(snap: CacheSnapshot, pools_known: bool = True) -> list[str]:
    """One sentence per pool (component x tier), in the snapshot's pool order."""
    return [pool_words(snap, p, pools_known) for p in snap.pools]


def findings(snap: CacheSnapshot, pools_known: bool = True) -> list[Finding]:
    """What looks wrong or risky in the snapshot, errors first.

    Checks: pool conservation (held < 0: double counting; free > capacity), in-flight larger
    than protected + held, pools with nothing free or evictable, pools mostly pinned (these
    skipped, with one info finding, when ``pools_known`` is false), locks and
    transfers naming nodes that do not exist, FULL nodes with no data, FULL device data under a
    device-evicted parent (prefix closure), auxiliary device data without FULL device data;
    counts auxiliary tombstones whose FULL stays on device (info).
    """
    out: list[Finding] = []
    ids = {n.node_id: n for n in snap.nodes}
    if not pools_known:
        out.append(Finding(INFO, "pools", "capacities unknown (an external engine's pool sizes "
                           "are not published): the budget checks are skipped"))
    for p in snap.pools if pools_known else ():
        subj, u = f"{p.component}/{p.tier}", unit_of(p.component)
        if p.held < 0:
            out.append(Finding(ERROR, subj, f"free {p.available} + evictable {p.evictable} + "
                               f"protected {p.protected} = {p.capacity - p.held} {u} exceeds the "
                               f"capacity {p.capacity} by {-p.held}: slots are counted twice"))
        if p.available > p.capacity or p.available < 0:
            out.append(Finding(ERROR, subj, f"free count {p.available} is outside "
                               f"[0, capacity {p.capacity}]"))
        if p.in_flight > p.protected + max(p.held, 0):
            out.append(Finding(ERROR, subj, f"{p.in_flight} {u} in flight but only "
                               f"{p.protected} protected and {max(p.held, 0)} held: a "
                               "transfer's destination slots are not pinned"))
        if p.capacity and p.available + p.evictable == 0:
            out.append(Finding(WARNING, subj, f"nothing free or evictable ({p.protected} "
                               f"protected, {p.held} held): the next allocation here fails"))
        elif p.capacity and p.protected > 0.8 * p.capacity:
            out.append(Finding(WARNING, subj, f"{_pct(p.protected, p.capacity)} of the pool is "
                               f"pinned ({p.protected} of {p.capacity} {u})"))
    for lk in snap.locks:
        missing = sorted({i for _c, nids in lk.pins for i in nids if i not in ids})
        if missing:
            out.append(Finding(ERROR, f"lock {lk.receipt_id}", f"lock of {lk.owner!r} pins "
                               f"nodes that do not exist: {missing[:8]}"))
    for t in snap.transfers:
        missing = sorted(i for i in t.node_ids if i not in ids)
        if missing:
            out.append(Finding(ERROR, f"transfer {t.transfer_id}", f"{t.kind} transfer names "
                               f"nodes that do not exist: {missing[:8]}"))
    fi = next((i for i, c in enumerate(snap.components) if rules(c).is_backbone), None)
    if fi is not None:
        for n in snap.nodes:
            if n.parent_id is None:
                continue
            c = n.components[fi]
            if c.device_len is None and c.host_len is None:
                out.append(Finding(ERROR, f"node {n.node_id}", "FULL holds no data on either "
                                   "tier (a dead node left in the tree)"))
            par = ids.get(n.parent_id)
            if (c.device_len is not None and par is not None and par.parent_id is not None
                    and par.components[fi].device_len is None):
                out.append(Finding(ERROR, f"node {n.node_id}", f"FULL data on the device under "
                                   f"parent {n.parent_id}, which is evicted from the device "
                                   "(device prefix closure broken)"))
        out += _auxiliary(snap, fi)
    rank = {ERROR: 0, WARNING: 1, INFO: 2}
    return sorted(out, key=lambda f: rank[f.severity])


def _auxiliary(snap: CacheSnapshot, fi: int) -> list[Finding]:
    """Auxiliary (SWA / MAMBA) data against FULL: device data needs FULL on the device; a
    tombstone whose FULL stays on device is normal (that component's own pressure, or outside
    the window) and is counted in words."""
    out: list[Finding] = []
    for ci, comp in enumerate(snap.components):
        if ci == fi:
            continue
        kept_nodes = kept_tokens = 0
        for n in snap.nodes:
            if n.parent_id is None:
                continue
            c, f = n.components[ci], n.components[fi]
            if c.device_len is not None and f.device_len is None:
                out.append(Finding(ERROR, f"node {n.node_id}", f"{comp} data on the device but "
                                   "FULL is not (auxiliary data without its backbone)"))
            if (not rules(comp).boundary_state and c.device_len is None and c.host_len is None
                    and f.device_len is not None):  # a boundary state (MAMBA): none on most nodes
                kept_nodes += 1
                kept_tokens += n.key_len
        if kept_nodes:
            out.append(Finding(INFO, f"{comp}/device", f"{kept_nodes} nodes ({kept_tokens} "
                               f"tokens) hold no {comp} data while their FULL KV stays on "
                               f"device ({comp} tombstones: its own pressure, or outside the "
                               "window); they still serve the FULL prefix and an insert heals "
                               "them"))
    return out


def doctor_report(snap: CacheSnapshot, pools_known: bool = True) -> str:
    """The full plain-text report: a headline, the findings, then the budget per pool."""
    fs = findings(snap, pools_known)
    n_err = sum(f.severity == ERROR for f in fs)
    n_warn = sum(f.severity == WARNING for f in fs)
    head = (f"cache at seq {snap.seq}: {len(snap.nodes) - 1} nodes, {len(snap.locks)} locks, "
            f"{len(snap.transfers)} transfers in flight; {n_err} errors, {n_warn} warnings")
    lines = [head]
    lines += [f"  {f.severity.upper()} {f.subject}: {f.message}" for f in fs]
    lines.append("budget:")
    lines += [f"  {w}" for w in budget_words(snap, pools_known)]
    return "\n".join(lines)
