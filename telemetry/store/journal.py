"""The cache state replayed from the mutation journal: the sinks' replica, and the UI's ledgers.

``Journal`` feeds every accepted mutation to a ``SnapshotBuilder`` started from the snapshot the
cache gave at ``attach``, so the sinks can write keyframes (``snapshot()``) without asking the
cache anything. It also keeps each pool's evictable / protected / in-flight counts incrementally
(the same derivation ``SnapshotBuilder.snapshot`` does by a full scan), which is what the OTel
gauges and the store's metric samples read. Mutations must arrive in seq order; a late one is
skipped and a gap (records dropped upstream) is counted and remembered, since no state after it
can be rebuilt exactly: the replica then stops (``broken``), while the mutations themselves are
still accepted for the store.

It lives beside the store because both sides read it: the fan-out keeps its live replica with it
(``telemetry/sinks/fanout.py``) and the UI replays a store's mutations with it (budget timeline).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable
from typing import Protocol

from radixscope.cache import events as ev
from radixscope.cache.snapshot import CacheSnapshot, SnapshotBuilder
from radixscope.cache.tiers import TIER_LABELS, Tier
from radixscope.telemetry.store.keyframes import TokenRefs

PoolKey = tuple[str, str]  # (component, tier)
log = logging.getLogger("radixscope.telemetry")


class Counters(Protocol):
    """Where the journal counts its anomalies (telemetry's ``Health`` in the sinks)."""

    def note(self, name: str, n: int = 1) -> None: ...

    def fail(self, stage: str, exc: BaseException | None = None, what: str = "") -> None: ...


class Tally:
    """``Counters`` of a replay nobody watches (the UI's): counted here, failures logged."""

    def __init__(self) -> None:
        self.notes: dict[str, int] = {}
        self.failures: dict[str, int] = {}

    def note(self, name: str, n: int = 1) -> None:
        self.notes[name] = self.notes.get(name, 0) + n

    def fail(self, stage: str, exc: BaseException | None = None, what: str = "") -> None:
        self.failures[stage] = self.failures.get(stage, 0) + 1
        log.error("journal replay failure at %s %s: %r", stage, what, exc)


class Journal:
    """Replays the mutation stream and keeps per-pool ledgers.

    Args:
        start: the snapshot the cache passed to ``attach``.
        health: counters for gaps and late mutations (None: a fresh ``Tally``).
    """

    def __init__(self, start: CacheSnapshot, health: Counters | None = None) -> None:
        self.health = health if health is not None else Tally()
        self.builder = SnapshotBuilder(start)
        self.token_refs = TokenRefs(start)
        self.components = start.components
        self._ci = {c: i for i, c in enumerate(start.components)}
        self.gaps: list[tuple[int, int]] = []  # (last seq before, first seq after)
        self.applied = 0
        self.last_seq = start.seq
        self.broken = False  # after a gap the replica stops; keyframes and samples stop with it
        order = {c: i for i, c in enumerate(start.components)}
        pools = sorted(start.pools, key=lambda p: (order[p.component], Tier.of(p.tier)))
        self.capacity: dict[PoolKey, int] = {(p.component, p.tier): p.capacity for p in pools}
        self.available: dict[PoolKey, int] = {(p.component, p.tier): p.available
                                              for p in start.pools}
        self.evictable: dict[PoolKey, int] = dict.fromkeys(self.capacity, 0)
        self.protected: dict[PoolKey, int] = dict.fromkeys(self.capacity, 0)
        self.in_flight: dict[PoolKey, int] = dict.fromkeys(self.capacity, 0)
        # per component, per tier: its pool key, or None where that tier has no pool
        self._keys = {c: tuple((c, lbl) if (c, lbl) in self.capacity else None
                               for lbl in TIER_LABELS) for c in self.components}
        for nid, rec in self.builder.nodes.items():
            if nid != 0:
                for c, st in zip(self.components, rec[5], strict=True):
                    self._delta(c, st, +1)
        for t in self.builder.transfers.values():
            self._transfer(t.tier, t.amounts, +1)

    @property
    def seq(self) -> int:
        return self.builder.seq

    def accept(self, mutations: list[tuple]) -> list[tuple]:
        """Apply mutations in seq order and return those accepted (late ones are skipped).

        Args:
            mutations: mutation tuples ``(seq, op_id, kind, node, comp, tier, value)``.

        Returns:
            The accepted mutations, sorted by seq, for the store to write.
        """
        ms = sorted(mutations, key=_SEQ)
        out: list[tuple] = []
        for m in ms:
            seq = m[0]
            last = self.last_seq
            if seq != last + 1:
                if seq <= last:
                    self.health.note("late_mutations")
                    continue
                self.gaps.append((last, seq))
                self.health.note("journal_gaps")
                self.broken = True  # the replica cannot follow a journal with holes
            self.last_seq = seq
            out.append(m)
            if not self.broken:
                try:
                    self._apply(m)
                except Exception as e:  # noqa: BLE001 - guard point: stop replaying, keep storing
                    self.broken = True
                    self.health.fail("journal.replay", e, f"mutation {seq} ({m[2]})")
        if not self.broken:
            self.applied += len(out)
        return out

    def snapshot(self) -> CacheSnapshot:
        """The replayed state at ``self.seq``."""
        return self.builder.snapshot()

    def keyframe_dict(self) -> dict:
        """``self.snapshot().to_dict()``, built straight from the replica and the ledgers
        (no frozen snapshot, no per-pool scan of every node), with each node's tokens given
        as a reference ``[origin, start, end]`` into the ``node_tokens`` table
        (``token_refs``; see ``telemetry.store.keyframes``): what a keyframe stores."""
        b = self.builder
        refs = self.token_refs.refs
        order = {c: i for i, c in enumerate(self.components)}
        return {
            "seq": b.seq,
            "page_size": b.page_size,
            "components": list(self.components),
            "token_refs": 1,
            "nodes": [[nid, r[0], r[1], refs[nid], r[3], r[4], r[5]]
                      for nid, r in sorted(b.nodes.items())],
            "pools": [list(p) for p in self.pools()],
            "locks": [[rid, owner, anchor, tier,
                       [[c, list(ids)] for c, ids in sorted(pins.items(),
                                                           key=lambda kv: order[kv[0]])]]
                      for rid, (owner, anchor, tier, pins) in sorted(b.locks.items())],
            "transfers": [[t.transfer_id, t.kind, t.anchor, t.tier, list(t.node_ids),
                           [[c, a] for c, a in t.amounts]]
                          for _, t in sorted(b.transfers.items())],
        }

    def pools(self) -> list[tuple[str, str, int, int, int, int, int]]:
        """``(component, tier, capacity, available, evictable, protected, in_flight)`` per pool."""
        return [(k[0], k[1], self.capacity[k], self.available[k], self.evictable[k],
                 self.protected[k], self.in_flight[k]) for k in self.capacity]

    # ---- incremental ledgers ----------------------------------------------------------------
    def _apply(self, m: tuple) -> None:
        seq, _op, kind, node, comp, tier, value = m
        b = self.builder
        nodes = b.nodes
        if kind == ev.COMP_STATE:  # the most frequent kind: applied here, as the builder would
            states = nodes[node][5]
            ci = self._ci[comp]
            if node != 0:
                self._delta(comp, states[ci], -1)
                self._delta(comp, value, +1)
            states[ci] = [tuple(value[0]), list(value[1])]
            b.seq = seq
        elif kind == ev.POOL_AVAILABLE:
            b.pools[(comp, tier)][1] = value
            self.available[(comp, tier)] = value
            b.seq = seq
        elif kind == ev.NODE_TOUCH:
            b.apply(m)
        elif kind == ev.LOCK_ACQUIRE:  # applied here, as the builder would, in one pass
            rid, owner, pins = value
            self._pin(tier, pins, +1)
            b.locks[rid] = [owner, node, tier, {c: list(ids) for c, ids in pins}]
            b.seq = seq
        elif kind == ev.LOCK_RELEASE:
            rid, pins, final = value
            self._pin(tier, pins, -1)
            held = (b.locks.pop(rid) if final else b.locks[rid])[3]
            for c, ids in pins:
                rest = held.pop(c, [])
                for nid in ids:
                    rest.remove(nid)  # a pin the lock does not hold: ValueError, replay stops
                if rest:
                    held[c] = rest
            b.seq = seq
        elif kind == ev.NODE_CREATE:
            self.token_refs.create(node, len(value[2]))
            b.apply(m)
        elif kind == ev.NODE_SPLIT:
            self.token_refs.split(node, value[0], value[1])
            b.apply(m)
        elif kind == ev.NODE_DELETE:
            self.token_refs.delete(node)
            rec = nodes.get(node)
            if rec is not None and node != 0:
                for c, st in zip(self.components, rec[5], strict=True):
                    self._delta(c, st, -1)
            b.apply(m)
        elif kind == ev.TRANSFER_START:
            b.apply(m)
            self._transfer(tier, value[3], +1)
        elif kind == ev.TRANSFER_DONE:
            t = b.transfers.get(value[0])
            b.apply(m)
            if t is not None:
                self._transfer(t.tier, t.amounts, -1)
        else:
            b.apply(m)

    def _pin(self, tier: str, pins, step: int) -> None:
        """A lock taken (``step=+1``) or released (-1): each pinned node's ref on the lock's
        tier moves by ``step`` and, in the same pass, the ledgers: the node's value on that
        tier moves between evictable and protected exactly when its ref crosses zero (the ref
        on a tier guards the value there). The root's refs move; it holds no slots."""
        t = Tier.of(tier)
        crossing = 0 if step > 0 else 1
        nodes = self.builder.nodes
        for c, ids in pins:
            ci = self._ci[c]
            moved = 0
            for nid in ids:
                st = nodes[nid][5][ci]
                refs = st[1]
                if refs[t] == crossing and nid:
                    n = st[0][t]
                    if n is not None:
                        moved += n
                refs[t] += step
            key = self._keys[c][t]
            if moved and key is not None:
                if step > 0:
                    self.evictable[key] -= moved
                    self.protected[key] += moved
                else:
                    self.protected[key] -= moved
                    self.evictable[key] += moved

    def _delta(self, comp: str, state, sign: int) -> None:
        """Add (``sign=+1``) or remove one node-component state's slots to the ledgers."""
        lens, refs = state
        keys = self._keys[comp]
        for t, n in enumerate(lens):
            if n is not None:
                key = keys[t]
                if key is not None:
                    (self.protected if refs[t] > 0 else self.evictable)[key] += sign * n

    def _transfer(self, tier: str, amounts: Iterable, sign: int) -> None:
        for c, a in amounts:
            key = (c, tier)
            if key in self.in_flight:
                self.in_flight[key] += sign * a


_SEQ = operator.itemgetter(0)
