"""The sinks' replica of the cache state: the mutation journal replayed as it arrives.

``Journal`` feeds every accepted mutation to a ``SnapshotBuilder`` started from the snapshot the
cache gave at ``attach``, so the sinks can write keyframes (``snapshot()``) without asking the
cache anything. It also keeps each pool's evictable / protected / in-flight counts incrementally
(the same derivation ``SnapshotBuilder.snapshot`` does by a full scan), which is what the OTel
gauges and the store's metric samples read. Mutations must arrive in seq order; a late one is
skipped and a gap (records dropped upstream) is counted and remembered, since no state after it
can be rebuilt exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

from cache import events as ev
from cache.snapshot import CacheSnapshot, SnapshotBuilder
from telemetry.health import Health

PoolKey = tuple[str, str]  # (component, tier)


class Journal:
    """Replays the mutation stream and keeps per-pool ledgers.

    Args:
        start: the snapshot the cache passed to ``attach``.
        health: counters for gaps and late mutations.
    """

    def __init__(self, start: CacheSnapshot, health: Health) -> None:
        self.health = health
        self.builder = SnapshotBuilder(start)
        self.components = start.components
        self.gaps: list[tuple[int, int]] = []  # (last seq before, first seq after)
        self.applied = 0
        self.capacity: dict[PoolKey, int] = {(p.component, p.tier): p.capacity
                                             for p in start.pools}
        self.available: dict[PoolKey, int] = {(p.component, p.tier): p.available
                                              for p in start.pools}
        self.evictable: dict[PoolKey, int] = dict.fromkeys(self.capacity, 0)
        self.protected: dict[PoolKey, int] = dict.fromkeys(self.capacity, 0)
        self.in_flight: dict[PoolKey, int] = dict.fromkeys(self.capacity, 0)
        for nid, rec in self.builder.nodes.items():
            for ci in range(len(self.components)):
                self._count(nid, rec, ci, +1)
        for t in self.builder.transfers.values():
            self._transfer(t.tier, t.amounts, +1)

    @property
    def seq(self) -> int:
        return self.builder.seq

    def accept(self, mutations: Iterable[tuple]) -> list[tuple]:
        """Apply mutations in seq order and return those accepted (late ones are skipped).

        Args:
            mutations: mutation tuples ``(seq, op_id, kind, node, comp, tier, value)``.

        Returns:
            The accepted mutations, sorted by seq, for the store to write.
        """
        ms = sorted(mutations, key=_seq_of)
        out: list[tuple] = []
        for m in ms:
            seq = m[0]
            last = self.builder.seq
            if seq <= last:
                self.health.note("late_mutations")
                continue
            if seq != last + 1:
                self.gaps.append((last, seq))
                self.health.note("journal_gaps")
            self._apply(m)
            out.append(m)
        self.applied += len(out)
        return out

    def snapshot(self) -> CacheSnapshot:
        """The replayed state at ``self.seq``."""
        return self.builder.snapshot()

    def pools(self) -> list[tuple[str, str, int, int, int, int, int]]:
        """``(component, tier, capacity, available, evictable, protected, in_flight)`` per pool."""
        return [(k[0], k[1], self.capacity[k], self.available[k], self.evictable[k],
                 self.protected[k], self.in_flight[k]) for k in self.capacity]

    # ---- incremental ledgers ----------------------------------------------------------------
    def _apply(self, m: tuple) -> None:
        _seq, _op, kind, node, comp, tier, value = m
        b = self.builder
        nodes = b.nodes
        if kind == ev.COMP_STATE:
            ci = b._ci[comp]
            self._count(node, nodes[node], ci, -1)
            b.apply(m)
            self._count(node, nodes[node], ci, +1)
        elif kind in (ev.LOCK_ACQUIRE, ev.LOCK_RELEASE):
            pins = value[2] if kind == ev.LOCK_ACQUIRE else value[1]
            touched = [(nid, b._ci[c]) for c, ids in pins for nid in ids]
            for nid, ci in touched:
                self._count(nid, nodes[nid], ci, -1)
            b.apply(m)
            for nid, ci in touched:
                self._count(nid, nodes[nid], ci, +1)
        elif kind == ev.NODE_DELETE:
            rec = nodes.get(node)
            if rec is not None:
                for ci in range(len(self.components)):
                    self._count(node, rec, ci, -1)
            b.apply(m)
        elif kind == ev.POOL_AVAILABLE:
            b.apply(m)
            self.available[(comp, tier)] = value
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

    def _count(self, nid: int, rec: list, ci: int, sign: int) -> None:
        if nid == 0:
            return
        dev, host, lock_ref, host_ref = rec[5][ci]
        comp = self.components[ci]
        if dev is not None:
            key = (comp, ev.TIER_DEVICE)
            if key in self.capacity:
                led = self.protected if lock_ref > 0 else self.evictable
                led[key] += sign * dev
        if host is not None:
            key = (comp, ev.TIER_HOST)
            if key in self.capacity:
                led = self.protected if host_ref > 0 else self.evictable
                led[key] += sign * host

    def _transfer(self, tier: str, amounts: Iterable, sign: int) -> None:
        for c, a in amounts:
            key = (c, tier)
            if key in self.in_flight:
                self.in_flight[key] += sign * a


def _seq_of(m: tuple) -> int:
    return m[0]
