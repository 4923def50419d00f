"""Plain frozen snapshots of the cache, and the replay that rebuilds them from mutations.

``HiRadixCache.snapshot()`` builds a ``CacheSnapshot`` from the live tree (reading its ledgers);
``SnapshotBuilder`` rebuilds one from a starting snapshot plus the mutation journal (deriving the
ledgers from node states). Tests hold the two equal, which checks the journal *and* the ledgers.
Only ids, lengths, refs and tokens appear here: no tensors, no node objects.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from radixscope.cache import events as ev
from radixscope.cache.tiers import DEVICE, HOST, N_TIERS, TIER_LABELS, Tier

STATE_DEVICE = "device"
STATE_HOST = "host"
STATE_BOTH = "device+host"
STATE_TOMBSTONE = "tombstone"


@dataclass(frozen=True, slots=True)
class ComponentState:
    """One component on one node, per tier (``Tier`` order): ``lens[t]`` the slots held there
    (``None`` = no value there), ``refs[t]`` the pins there (lock ref on device, host ref on
    host). The tuples have one entry per tier, however many tiers there are."""

    lens: tuple[int | None, ...]
    refs: tuple[int, ...]

    def length(self, tier: Tier | str) -> int | None:
        t = Tier.of(tier) if isinstance(tier, str) else tier
        return self.lens[t] if t < len(self.lens) else None

    def ref(self, tier: Tier | str) -> int:
        t = Tier.of(tier) if isinstance(tier, str) else tier
        return self.refs[t] if t < len(self.refs) else 0

    # named views of the two tiers every reader shows today
    @property
    def device_len(self) -> int | None:
        return self.lens[DEVICE]

    @property
    def host_len(self) -> int | None:
        return self.lens[HOST]

    @property
    def lock_ref(self) -> int:
        return self.refs[DEVICE]

    @property
    def host_ref(self) -> int:
        return self.refs[HOST]

    @property
    def tiers(self) -> tuple[str, ...]:
        """Labels of the tiers holding a value, fastest first."""
        return tuple(TIER_LABELS[t] if t < N_TIERS else f"tier{t}"
                     for t, n in enumerate(self.lens) if n is not None)

    @property
    def state(self) -> str:
        """``device``, ``host``, ``device+host`` (tiers holding a value, joined) or
        ``tombstone``."""
        return "+".join(self.tiers) or STATE_TOMBSTONE

    def as_tuple(self) -> tuple:
        """The journal's ``comp.state`` value: ``(lens, refs)``."""
        return (self.lens, self.refs)

    @classmethod
    def on(cls, lens: dict | None = None, refs: dict | None = None) -> ComponentState:
        """From ``{tier: length}`` and ``{tier: pins}`` (a tier or its label); tiers left out
        hold no value and no pins."""
        ln: list[int | None] = [None] * N_TIERS
        rf = [0] * N_TIERS
        for t, n in (lens or {}).items():
            ln[Tier.of(t) if isinstance(t, str) else t] = n
        for t, n in (refs or {}).items():
            rf[Tier.of(t) if isinstance(t, str) else t] = n
        return cls(tuple(ln), tuple(rf))

    @classmethod
    def from_value(cls, value) -> ComponentState:
        """From a ``comp.state`` value / stored pair ``(lens, refs)`` (lists or tuples)."""
        lens, refs = value
        return cls(tuple(lens), tuple(refs))


EMPTY_STATE = ComponentState((None,) * N_TIERS, (0,) * N_TIERS)


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node_id: int
    parent_id: int | None
    extra_key: object
    tokens: tuple[int, ...]
    last_access: int
    hit_count: int
    components: tuple[ComponentState, ...]  # aligned with CacheSnapshot.components

    @property
    def key_len(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    component: str
    tier: str
    capacity: int
    available: int
    evictable: int
    protected: int
    in_flight: int

    @property
    def held(self) -> int:
        """Slots held outside the tree (request-private rows): the conservation remainder."""
        return self.capacity - self.available - self.evictable - self.protected


@dataclass(frozen=True, slots=True)
class LockSnapshot:
    receipt_id: int
    owner: str | None
    anchor: int
    tier: str
    pins: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class TransferSnapshot:
    transfer_id: int
    kind: str
    anchor: int
    tier: str
    node_ids: tuple[int, ...]
    amounts: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class CacheSnapshot:
    seq: int
    page_size: int
    components: tuple[str, ...]
    nodes: tuple[NodeSnapshot, ...]  # sorted by node_id; the root (id 0) first
    pools: tuple[PoolSnapshot, ...]
    locks: tuple[LockSnapshot, ...]
    transfers: tuple[TransferSnapshot, ...]

    def node(self, node_id: int) -> NodeSnapshot:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"node {node_id} is not in the snapshot at seq {self.seq}")

    def pool(self, component: str, tier: str) -> PoolSnapshot:
        for p in self.pools:
            if p.component == component and p.tier == tier:
                return p
        raise KeyError(f"no pool {component}/{tier} in the snapshot")

    # ---- plain-data round trip (store keyframes, crash bundles) ---------------------------
    def to_dict(self) -> dict:
        return {
            "seq": self.seq,
            "page_size": self.page_size,
            "components": list(self.components),
            "nodes": [[n.node_id, n.parent_id, n.extra_key, list(n.tokens), n.last_access,
                       n.hit_count, [[list(c.lens), list(c.refs)] for c in n.components]]
                      for n in self.nodes],
            "pools": [[p.component, p.tier, p.capacity, p.available, p.evictable, p.protected,
                       p.in_flight] for p in self.pools],
            "locks": [[lk.receipt_id, lk.owner, lk.anchor, lk.tier,
                       [[c, list(ids)] for c, ids in lk.pins]] for lk in self.locks],
            "transfers": [[t.transfer_id, t.kind, t.anchor, t.tier, list(t.node_ids),
                           [[c, a] for c, a in t.amounts]] for t in self.transfers],
        }

    @classmethod
    def from_dict(cls, d: dict) -> CacheSnapshot:
        try:
            state = _StateCache()
            nodes = tuple(
                NodeSnapshot(int(i), None if p is None else int(p), _hashable(ek),
                             tuple(toks), int(la), int(hc),
                             tuple(state(c) for c in comps))
                for i, p, ek, toks, la, hc, comps in d["nodes"])
            return cls(
                seq=int(d["seq"]), page_size=int(d["page_size"]),
                components=tuple(d["components"]), nodes=nodes,
                pools=tuple(PoolSnapshot(*p) for p in d["pools"]),
                locks=tuple(LockSnapshot(r, o, a, t, tuple((c, tuple(ids)) for c, ids in pins))
                            for r, o, a, t, pins in d["locks"]),
                transfers=tuple(TransferSnapshot(i, k, a, t, tuple(ids),
                                                 tuple((c, n) for c, n in am))
                                for i, k, a, t, ids, am in d["transfers"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a valid cache snapshot: {type(e).__name__}: {e}") from None


class _StateCache:
    """Equal component states share one frozen instance (most nodes are in a few states)."""

    def __init__(self) -> None:
        self._seen: dict[tuple, ComponentState] = {}

    def __call__(self, values) -> ComponentState:
        lens, refs = values
        key = (tuple(lens), tuple(refs))
        got = self._seen.get(key)
        if got is None:
            got = self._seen[key] = ComponentState(*key)
        return got


def _hashable(v: object) -> object:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


class SnapshotBuilder:
    """Replays mutations onto a starting snapshot. ``apply`` is an overwrite for states and a
    +/-1 for lock pins, exactly mirroring what the cache did; ``snapshot()`` freezes the result
    and derives each pool's evictable/protected from node states (the ledger recount)."""

    def __init__(self, start: CacheSnapshot) -> None:
        self.seq = start.seq
        self.page_size = start.page_size
        self.components = start.components
        self._ci = {c: i for i, c in enumerate(start.components)}
        # node id -> [parent, extra_key, tokens, last_access, hits, [[lens, refs], ...]]
        # (lens a tuple per tier, overwritten whole; refs a list per tier, moved by locks;
        # tokens a tuple, or the ``array`` a recorded ``node.create`` carried, kept as it is:
        # 8 bytes a token against a tuple's 40, which at 100 k nodes held the telemetry
        # writer's replica at 1.2 GB and its every create and delete touched ~200 scattered
        # int objects, traffic the cache's thread felt through the shared L3)
        self.nodes: dict[int, list] = {
            n.node_id: [n.parent_id, n.extra_key, n.tokens, n.last_access, n.hit_count,
                        [[c.lens, list(c.refs)] for c in n.components]]
            for n in start.nodes}
        self.pools = {(p.component, p.tier): [p.capacity, p.available] for p in start.pools}
        self.locks = {lk.receipt_id: [lk.owner, lk.anchor, lk.tier,
                                      {c: list(ids) for c, ids in lk.pins}] for lk in start.locks}
        self.transfers = {t.transfer_id: t for t in start.transfers}

    def apply_all(self, mutations: Iterable[tuple]) -> SnapshotBuilder:
        for m in mutations:
            self.apply(m)
        return self

    def apply(self, m: tuple) -> None:  # noqa: C901 - one branch per mutation kind
        seq, _op, kind, node, comp, tier, value = m
        if seq <= self.seq:
            return  # already contained in the starting snapshot
        self.seq = seq
        nodes = self.nodes
        if kind == ev.COMP_STATE:
            lens, refs = value
            nodes[node][5][self._ci[comp]] = [tuple(lens), list(refs)]
        elif kind == ev.NODE_TOUCH:
            cur = node
            while cur is not None and cur != 0:
                rec = nodes[cur]
                rec[3] = value
                rec[4] += 1
                cur = rec[0]
        elif kind == ev.POOL_AVAILABLE:
            self.pools[(comp, tier)][1] = value
        elif kind == ev.LOCK_ACQUIRE:
            rid, owner, pins = value
            t = Tier.of(tier)
            for c, ids in pins:
                ci = self._ci[c]
                for nid in ids:
                    nodes[nid][5][ci][1][t] += 1
            self.locks[rid] = [owner, node, tier, {c: list(ids) for c, ids in pins}]
        elif kind == ev.LOCK_RELEASE:
            rid, pins, final = value
            t = Tier.of(tier)
            held = self.locks[rid][3]
            for c, ids in pins:
                ci = self._ci[c]
                for nid in ids:
                    nodes[nid][5][ci][1][t] -= 1
                rest = held.get(c, [])
                for nid in ids:
                    rest.remove(nid)
                if not rest:
                    held.pop(c, None)
            if final:
                del self.locks[rid]
        elif kind == ev.NODE_CREATE:
            parent, extra_key, tokens = value
            toks = tokens if type(tokens) is array else tuple(tokens)
            nodes[node] = [parent, extra_key, toks, 0, 0, self._empty()]
        elif kind == ev.NODE_SPLIT:
            new_id, k, ref_comps = value
            child = nodes[node]
            nodes[new_id] = [child[0], child[1], child[2][:k], child[3], child[4], self._empty()]
            child[2] = child[2][k:]
            child[0] = new_id
            for lock in self.locks.values():  # the new parent inherits the child's pins
                for c in ref_comps:
                    ids = lock[3].get(c)
                    if ids and node in ids:
                        ids.insert(ids.index(node) + 1, new_id)
            for tid, t in list(self.transfers.items()):
                if node in t.node_ids:
                    ids = list(t.node_ids)
                    ids.insert(ids.index(node) + 1, new_id)
                    self.transfers[tid] = TransferSnapshot(t.transfer_id, t.kind, t.anchor, t.tier,
                                                           tuple(ids), t.amounts)
        elif kind == ev.NODE_DELETE:
            del nodes[node]
        elif kind == ev.TRANSFER_START:
            tid, tkind, node_ids, amounts = value
            self.transfers[tid] = TransferSnapshot(tid, tkind, node, tier, tuple(node_ids),
                                                   tuple((c, a) for c, a in amounts))
        elif kind == ev.TRANSFER_DONE:
            self.transfers.pop(value[0], None)
        else:
            raise ValueError(f"unknown mutation kind {kind!r} at seq {seq}")

    def _empty(self) -> list:
        return [[EMPTY_STATE.lens, list(EMPTY_STATE.refs)] for _ in self.components]

    def snapshot(self) -> CacheSnapshot:
        comps = self.components
        n_c = len(comps)
        state = _StateCache()
        # one pass: nodes, and per component / tier the evictable and protected recount
        ev_sum = [[0] * N_TIERS for _ in range(n_c)]
        pr_sum = [[0] * N_TIERS for _ in range(n_c)]
        nodes = []
        for nid, r in sorted(self.nodes.items()):
            states = tuple(state(c) for c in r[5])
            toks = r[2] if type(r[2]) is tuple else tuple(r[2])
            nodes.append(NodeSnapshot(nid, r[0], r[1], toks, r[3], r[4], states))
            if nid == 0:
                continue
            for ci, (lens, refs) in enumerate(r[5]):
                for t, n in enumerate(lens):
                    if n is not None:
                        (pr_sum if refs[t] > 0 else ev_sum)[ci][t] += n
        pools = []
        for (comp, tier), (cap, avail) in self.pools.items():
            ci = self._ci[comp]
            ti = Tier.of(tier)
            in_flight = sum(a for t in self.transfers.values() if t.tier == tier
                            for c, a in t.amounts if c == comp)
            pools.append(PoolSnapshot(comp, tier, cap, avail, ev_sum[ci][ti], pr_sum[ci][ti],
                                      in_flight))
        locks = tuple(
            LockSnapshot(rid, o, a, t, tuple((c, tuple(ids)) for c, ids in sorted(pins.items(),
                                                                               key=_comp_order(comps))))
            for rid, (o, a, t, pins) in sorted(self.locks.items()))
        return CacheSnapshot(self.seq, self.page_size, comps, tuple(nodes),
                             tuple(sorted(pools, key=_pool_order(comps))), locks,
                             tuple(t for _, t in sorted(self.transfers.items())))


def _comp_order(comps: tuple[str, ...]):
    idx = {c: i for i, c in enumerate(comps)}
    return lambda item: idx[item[0]]


def _pool_order(comps: tuple[str, ...]):
    idx = {c: i for i, c in enumerate(comps)}
    return lambda p: (idx[p.component], Tier.of(p.tier))


def replay(start: CacheSnapshot, mutations: Iterable[tuple], upto_seq: int | None = None
           ) -> CacheSnapshot:
    """The snapshot after applying ``mutations`` (those with seq <= ``upto_seq``) to ``start``."""
    b = SnapshotBuilder(start)
    for m in mutations:
        if upto_seq is not None and m[0] > upto_seq:
            break
        b.apply(m)
    return b.snapshot()
