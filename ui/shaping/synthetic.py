"""Deterministic synthetic snapshots of any size, for level-of-detail tests, benches and demos.

The shape imitates a serving workload: a few wide system-prompt trunks near the root, deeper
conversation chains below (parents drawn with a bias towards recent nodes), host-only data only
under host-only or backed-up parents (FULL stays prefix-closed on the device), SWA tombstones on
internal nodes, sparse MAMBA states, a few locked paths and an unacked transfer.
"""

from __future__ import annotations

import random

from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.cache.snapshot import (
    EMPTY_STATE,
    CacheSnapshot,
    ComponentState,
    LockSnapshot,
    NodeSnapshot,
    PoolSnapshot,
    TransferSnapshot,
)
from radixscope.cache.tiers import DEVICE, HOST, Tier

_EMPTY = EMPTY_STATE
_POOL_TIERS = (Tier.DEVICE.label, Tier.HOST.label)  # the tiers a synthetic tree fills


def synthetic_snapshot(n_nodes: int, components: tuple[str, ...] = (BACKBONE, WINDOW, STATE),
                       seed: int = 0, max_tokens: int = 64, n_locks: int = 8) -> CacheSnapshot:
    """A consistent-looking ``CacheSnapshot`` with ``n_nodes`` nodes (root included).

    Args:
        n_nodes: total nodes, >= 1.
        components: a valid component tuple (``full`` first).
        seed: the RNG seed; the same arguments always give the same snapshot.
        max_tokens: upper bound of a node's key length.
        n_locks: locked paths (each pins its node and ancestors for FULL).

    Raises:
        ValueError: ``n_nodes`` < 1, ``max_tokens`` < 1, or ``components`` not starting with full.
    """
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
        raise ValueError(f"n_nodes={n_nodes!r}: must be an int >= 1")
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens!r}: must be >= 1")
    if not components or components[0] != BACKBONE:
        raise ValueError(f"components={components!r}: must start with {BACKBONE!r}")
    rng = random.Random(seed)
    parent = _shape(n_nodes, rng)
    full_dev = [True]
    full_host = [True]
    for i in range(1, n_nodes):
        p = parent[i]
        dev = full_dev[p] and rng.random() < 0.93
        full_dev.append(dev)
        full_host.append((not dev) or rng.random() < 0.5)
    n_kids = [0] * n_nodes
    for p in parent[1:]:
        n_kids[p] += 1
    locked: set[int] = set()
    lock_rows = []
    dev_nodes = [i for i in range(1, n_nodes) if full_dev[i]]
    for r in range(min(n_locks, len(dev_nodes))):
        anchor = dev_nodes[rng.randrange(len(dev_nodes))]
        path = []
        cur = anchor
        while cur > 0:
            path.append(cur)
            cur = parent[cur]
        locked.update(path)
        lock_rows.append(LockSnapshot(r + 1, f"req-{r + 1}", anchor, "device",
                                      ((BACKBONE, tuple(path)),)))
    lock_count = {i: sum(1 for lk in lock_rows if i in lk.pins[0][1]) for i in locked}
    nodes = [NodeSnapshot(0, None, None, (), 0, 0, tuple(_EMPTY for _ in components))]
    rnd = rng.random
    cs = _interned()
    tok = 1000
    for i in range(1, n_nodes):
        k = (1 + int(rnd() * max_tokens)) * (8 if parent[i] == 0 else 1)
        comps = []
        for c in components:
            if c == BACKBONE:
                comps.append(cs(k if full_dev[i] else None, k if full_host[i] else None,
                                lock_count.get(i, 0), 0))
            elif c == WINDOW:
                live = full_dev[i] and (n_kids[i] == 0 or rng.random() < 0.3)
                comps.append(cs(k if live else None, k if live and full_host[i] else None, 0, 0))
            else:
                has = full_dev[i] and (n_kids[i] == 0 or rng.random() < 0.1)
                comps.append(cs(1 if has else None, None, 0, 0))
        nodes.append(NodeSnapshot(i, parent[i], None, tuple(range(tok, tok + k)),
                                  1 + int(rnd() * 10 * n_nodes), int(rnd() * 20),
                                  tuple(comps)))
        tok += k
    transfers = ()
    if n_nodes > 2:
        leaf = max(i for i in range(1, n_nodes) if full_dev[i] and full_host[i]) \
            if any(full_dev[i] and full_host[i] for i in range(1, n_nodes)) else 1
        transfers = (TransferSnapshot(1, "backup", leaf, "host", (leaf,),
                                      ((BACKBONE, len(nodes[leaf].tokens)),)),)
    pools = tuple(_pools(nodes, components))
    return CacheSnapshot(seq=n_nodes * 4, page_size=1, components=components, nodes=tuple(nodes),
                         pools=pools, locks=tuple(lock_rows), transfers=transfers)


def _interned():
    """A ``ComponentState`` factory that reuses equal (immutable) instances."""
    seen: dict[tuple, ComponentState] = {}

    def make(dev: int | None, host: int | None, lock: int, href: int) -> ComponentState:
        key = (dev, host, lock, href)
        c = seen.get(key)
        if c is None:
            c = seen[key] = ComponentState.on({DEVICE: dev, HOST: host}, {DEVICE: lock, HOST: href})
        return c

    return make


def _shape(n_nodes: int, rng: random.Random) -> list[int]:
    """Parent per node: system prompts under the root, few-shot heads under them, then
    conversations (chains of 1-10 turns) starting at a head or forking off an earlier turn."""
    parent = [-1]
    n_sys = min(8, n_nodes - 1)
    parent += [0] * n_sys
    heads = list(range(1, n_sys + 1))
    for _ in range(min(16, n_nodes - len(parent))):
        parent.append(rng.choice(heads[:n_sys]))
        heads.append(len(parent) - 1)
    first_turn = len(parent)
    while len(parent) < n_nodes:
        if len(parent) > first_turn and rng.random() < 0.2:
            cur = first_turn + int(rng.random() * (len(parent) - first_turn))  # a fork
        else:
            cur = heads[int(rng.random() * len(heads))]
        for _ in range(1 + int(rng.random() * 10)):
            if len(parent) >= n_nodes:
                break
            parent.append(cur)
            cur = len(parent) - 1
    return parent


def _pools(nodes: list[NodeSnapshot], components: tuple[str, ...]) -> list[PoolSnapshot]:
    out = []
    for ci, c in enumerate(components):
        for tier in _POOL_TIERS:
            ev = pr = 0
            for n in nodes[1:]:
                cs = n.components[ci]
                length = cs.length(tier)
                if length is None:
                    continue
                ref = cs.ref(tier)
                if ref > 0:
                    pr += length
                else:
                    ev += length
            cap = (ev + pr) * 5 // 4 + 64
            out.append(PoolSnapshot(c, tier, cap, cap - ev - pr, ev, pr, 0))
    return out
