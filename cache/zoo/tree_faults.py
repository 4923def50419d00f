"""Zoo faults in the tree's own bookkeeping: the load-back anchor, the FULL lock, the tombstone
cascade, the evictable ledger and a lock never released (classes 1, 2, 3, 7, 9).

Each ``install`` puts the historically buggy variant on one cache instance (an instance
attribute shadows the class's method); the class's code is untouched.
"""

from __future__ import annotations

import dataclasses

from radixscope.cache import events as ev
from radixscope.cache.eviction import is_useless
from radixscope.cache.keys import normalize_key
from radixscope.cache.results import LockReceipt
from radixscope.cache.tiers import DEVICE, HOST
from radixscope.cache.zoo import Fault


def _full_match_end(cache, key, extra_key):
    """The deepest whole node on ``key``'s path with FULL on device or host: what SGLang's
    ``last_host_node`` was before the fix (FULL alone decided; no other validator asked)."""
    tokens = normalize_key(key, cache.page_size)
    end = None
    for node, k in cache.tree.walk(tokens, extra_key):
        if k < len(node.key) or all(v is None for v in node.data[0].values):
            break
        end = node
    return end


def _install_anchor(cache, inj) -> None:
    """Class 1: ``last_host_node`` is the FULL-only match end again (pre-fix semantics: FULL
    alone decided), and the L2 load-back anchors on it instead of on ``best_match_node``, a
    node some component's validator rejects."""
    orig_match, orig_load = cache.match_prefix, cache.load_back

    def match_prefix(key, **kw):
        m = orig_match(key, **kw)
        end = _full_match_end(cache, key, kw.get("extra_key"))
        if end is None or end.id == m.best_match_node:
            return m
        return dataclasses.replace(m, last_host_node=end.id)

    def load_back(match, **kw):
        if match.last_host_node != match.best_match_node:
            inj.fire(f"load-back anchored on last_host_node {match.last_host_node}, not on "
                     f"best_match_node {match.best_match_node}",
                     (match.last_host_node, match.best_match_node))
            match = dataclasses.replace(match, best_match_node=match.last_host_node)
        return orig_load(match, **kw)
    cache.match_prefix = match_prefix
    cache.load_back = load_back


def _install_lock(cache, inj) -> None:
    """Class 2: the FULL lock walks from the node itself to the root, pinning the evicted
    bottom segment instead of skipping (and recording) it."""
    orig = cache._lock

    def _lock(n, owner):
        pins, skipped = cache.lock_pins(n)
        if not skipped:
            return orig(n, owner)
        path = cache.tree.path_to_root(n)
        pins = {c.index: (path if c.index == 0 else c.lock_pins(path[len(skipped):]))
                for c in cache.comps}
        inj.fire(f"lock on node {n.id} pinned its evicted bottom segment "
                 f"{[x.id for x in skipped]}", [x.id for x in skipped])
        rid = cache.acquire(n, DEVICE, pins, owner)
        return LockReceipt(rid, n.id, owner, ev.TIER_DEVICE,
                           tuple((cache.comps[ci].name, tuple(x.id for x in ns))
                                 for ci, ns in sorted(pins.items()) if ns),
                           (), False, cache.instance)
    cache._lock = _lock


def _install_cascade(cache, inj) -> None:
    """Class 3: the tombstone cascade deletes childless useless ancestors without asking
    whether a lock or an in-flight transfer still references them."""
    def _delete_tombstone_ancestors(node, acc, tier):
        while node.parent is not None and not node.children and is_useless(node):
            if any(any(d.refs) for d in node.data):
                inj.fire(f"tombstone cascade deleted node {node.id}, still referenced "
                         f"(refs {[list(d.refs) for d in node.data]})", (node.id,))
            parent = node.parent
            acc.add(cache.delete(node)[tier])  # the lock table still names it
            acc.deleted.append(node.id)
            node = parent
    cache._delete_tombstone_ancestors = _delete_tombstone_ancestors
    if getattr(cache, "storage", None) is not None:
        _prefetch_on_full_match_end(cache)


def _prefetch_on_full_match_end(cache) -> None:
    """With an L3 tier, class 3 as it shipped: SGLang then host-protected the prefetch's
    ``last_host_node``, the FULL-only match end (before seed 000's fix), which may be a node
    another component rejects: a tombstone, and the node the cascade deleted. The prefetch is
    anchored (and host-pinned) there; the match handed back is the correct one."""
    orig_mp, orig_match = cache._match_prefetch, cache._match

    def _match_prefetch(tokens, extra_key, cow, req_id):
        true = []

        def match(t, e, c):
            m = orig_match(t, e, c)
            true.append(m)
            end = _full_match_end(cache, t, e)
            if end is None or end.id == m.best_match_node or end.parent is None:
                return m
            return dataclasses.replace(m, best_match_node=end.id)
        cache._match = match
        try:
            out = orig_mp(tokens, extra_key, cow, req_id)
        finally:
            del cache._match
        return dataclasses.replace(out, best_match_node=true[0].best_match_node)
    cache._match_prefetch = _match_prefetch


def _install_ledger(cache, inj) -> None:
    """Class 7 (SGLang #35270): a FULL device value set on an unlocked node that is revived
    from host is added to the evictable ledger twice."""
    orig = cache.set_value

    def set_value(node, ci, tier, value, pages=None):
        d = node.data[ci]
        revive = (ci == 0 and tier == DEVICE and value is not None and d.values[DEVICE] is None
                  and d.values[HOST] is not None and d.refs[DEVICE] == 0)
        orig(node, ci, tier, value, pages)
        if revive:
            cache.evictable[ci][DEVICE] += cache.comps[ci].size(value)
            inj.fire(f"node {node.id}'s {cache.comps[ci].size(value)} revived FULL slots counted "
                     "evictable twice", (node.id,))
    cache.set_value = set_value


def _install_leak(cache, inj) -> None:
    """Class 9: a request that never unlocks: its last lock's ``unlock`` is dropped."""
    orig = cache.unlock

    def unlock(receipt, **kw):
        entry = cache.locks.get(getattr(receipt, "receipt_id", None))
        others = entry is not None and any(
            e.owner == entry.owner and rid != entry.receipt_id for rid, e in cache.locks.items())
        if entry is None or others or not isinstance(entry.owner, str):
            return orig(receipt, **kw)
        inj.fire(f"unlock of receipt {receipt.receipt_id} (owner {entry.owner}, anchor "
                 f"{entry.anchor}) dropped", (entry.anchor,), op_id=cache.current_op_id)
        return None
    cache.unlock = unlock


FAULTS = (
    Fault("load_back_anchor", 1, "L2 load-back anchored on a node some component's validator "
          "rejects", "seed 000 (SGLang issue #24869, best_match_node fix)",
          "match_prefix hands out the FULL-only match end (pre-fix last_host_node) as the "
          "load-back anchor", "transfer validation: load_back's anchor check (StaleHandle)",
          _install_anchor),
    Fault("lock_evicted_segment", 2, "FULL lock not skipping an evicted bottom segment",
          "seed 000 (SGLang issue #24869, acquire_component_lock)",
          "lock pins the whole path from the node, host-only bottom segment included",
          "check(): full.pin_without_device (new)", _install_lock),
    Fault("tombstone_cascade", 3, "tombstone cascade deleting a host-referenced or locked parent",
          "seed 001 (SGLang PR #23696, follow-up of #22592)",
          "the cascade deletes childless useless ancestors without looking at lock/host refs",
          "check(): lock.dead_pin / transfer pins", _install_cascade),
    Fault("ledger_twice", 7, "evictable-size ledger counted twice",
          "SGLang issue #35270 (fixed by PR #35470)",
          "a FULL value revived from host is added to the evictable ledger twice",
          "check(): full.device.evictable_ledger and conservation", _install_ledger),
    Fault("leaked_lock", 9, "a lock that is never released",
          "field (a request that never unlocks)",
          "a request's last unlock is dropped",
          "engine guard: no lock owned by a request outlives it (new)", _install_leak),
)
