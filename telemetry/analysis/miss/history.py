"""What happened to the nodes on a key's path before a given seq: one pass over the journal.

``KeyHistory`` replays the structure (parents and tokens only) from a start snapshot and records:

- for every node and component, the seqs at which its device or host value was dropped
  (eviction, demotion to host, tombstoning, the MAMBA per-path cap, the node's deletion);
- how every node was born (``node.create`` by an insert, or ``node.split``);
- every deletion of a node that, when deleted, lay on the key's path in the key's namespace,
  with the tier it was last held on and the node whose eviction caused it (a leaf evicted
  first, then its childless tombstone ancestors in the same op).

Each event carries its seq and op id; ``ops`` maps op ids to ``(op, req_id)`` for the words.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from radixscope.cache import events as ev
from radixscope.cache.snapshot import EMPTY_STATE, CacheSnapshot
from radixscope.cache.tiers import TIER_LABELS


@dataclass(frozen=True)
class Deletion:
    seq: int
    op_id: int
    node: int
    start: int          # key position of the node's first token
    end: int            # key position after its last token
    tier: str           # where its FULL data was last held: "device" or "host"
    cause: int          # the node whose eviction started the cascade (itself for a leaf)


@dataclass(frozen=True)
class Event:
    seq: int
    op_id: int


class KeyHistory:
    """Scan ``mutations`` (seq order, after ``start``) for events about ``key``'s path.

    Args:
        start: the state the mutations apply to.
        mutations: decoded mutation tuples, oldest first (stop before the seq of interest).
        key: the page-truncated key.
        extra_key: its namespace.
    """

    def __init__(self, start: CacheSnapshot, mutations: Iterable[tuple], key: tuple[int, ...],
                 extra_key: object) -> None:
        self.key = key
        self.extra_key = extra_key
        self.components = start.components
        self.start_seq = start.seq
        # node -> [parent, extra_key, tokens]
        self._tree: dict[int, list] = {n.node_id: [n.parent_id, n.extra_key, n.tokens]
                                       for n in start.nodes}
        self._state: dict[tuple[int, str], tuple] = {
            (n.node_id, c): s.lens
            for n in start.nodes for c, s in zip(start.components, n.components, strict=True)}
        self._full_held: dict[int, tuple] = {}  # node -> last FULL lens (per tier) with a value
        self.dropped: dict[tuple[int, str, str], list[Event]] = {}
        self.born: dict[int, tuple[str, Event]] = {}
        self.deletions: list[Deletion] = []
        self._last_delete: dict[int, tuple[int, int | None, int]] = {}  # op -> (node, parent, cause)
        for m in mutations:
            self._apply(m)

    def _apply(self, m: tuple) -> None:
        seq, op_id, kind, node, comp, _tier, value = m
        if kind == ev.COMP_STATE:
            self._set_state(seq, op_id, node, comp, tuple(value[0]))
        elif kind == ev.NODE_CREATE:
            parent, extra_key, tokens = value
            self._tree[node] = [parent, extra_key, tuple(tokens)]
            self.born[node] = ("create", Event(seq, op_id))
        elif kind == ev.NODE_SPLIT:
            new_id, k, _refs = value
            child = self._tree[node]
            self._tree[new_id] = [child[0], child[1], child[2][:k]]
            child[2] = child[2][k:]
            child[0] = new_id
            self.born[new_id] = ("split", Event(seq, op_id))
        elif kind == ev.NODE_DELETE:
            # the values the node still held leave with it (schema 6: no comp.state first):
            # dropped one at a time, in the order a schema 5 journal clears them (component
            # by component, tier by tier), so both read the same (the tier it was last held on)
            for c in self.components:
                lens = list(self._state.get((node, c), EMPTY_STATE.lens))
                for t, n in enumerate(lens):
                    if n is not None:
                        lens[t] = None
                        self._set_state(seq, op_id, node, c, tuple(lens))
            self._delete(seq, op_id, node)

    def _set_state(self, seq: int, op_id: int, node: int, comp: str, new: tuple) -> None:
        old = self._state.get((node, comp), EMPTY_STATE.lens)
        for tier, was, now in zip(TIER_LABELS, old, new, strict=True):
            if was is not None and now is None:
                self.dropped.setdefault((node, comp, tier), []).append(Event(seq, op_id))
        if comp == self.components[0] and any(x is not None for x in old):
            self._full_held[node] = old
        self._state[(node, comp)] = new

    def _delete(self, seq: int, op_id: int, node: int) -> None:
        rec = self._tree.get(node)
        if rec is None:
            return
        prev = self._last_delete.get(op_id)
        cause = prev[2] if prev is not None and prev[1] == node else node
        self._last_delete[op_id] = (node, rec[0], cause)
        span = self._on_key(node)
        if span is not None:
            last = self._full_held.get(node, self._state.get((node, self.components[0]),
                                                             EMPTY_STATE.lens))
            # the fastest tier that held it
            tier = next((lbl for lbl, n in zip(TIER_LABELS, last, strict=True) if n is not None),
                        ev.TIER_HOST)
            self.deletions.append(Deletion(seq, op_id, node, span[0], span[1], tier, cause))
        del self._tree[node]

    def _on_key(self, node: int) -> tuple[int, int] | None:
        """``(start, end)`` key positions of ``node`` if its path is a prefix-extension of the
        key (its tokens agree with the key wherever both have tokens), else None."""
        chain = []
        cur = node
        while True:
            rec = self._tree.get(cur)
            if rec is None or rec[0] is None:
                break
            chain.append(rec)
            cur = rec[0]
        if not chain or chain[-1][1] != self.extra_key:
            return None
        pos = 0
        key = self.key
        for rec in reversed(chain):
            toks = rec[2]
            n = min(len(toks), len(key) - pos)
            if n <= 0 or key[pos:pos + n] != toks[:n]:
                return None
            pos += len(toks)
        return pos - len(chain[0][2]), pos

    def last_drop(self, node: int, comp: str, tier: str) -> Event | None:
        """The latest time ``node`` lost ``comp``'s value on ``tier``, if it did."""
        evs = self.dropped.get((node, comp, tier))
        return evs[-1] if evs else None

    def deletion_covering(self, pos: int) -> Deletion | None:
        """The latest deletion of a node on the key's path that held key position ``pos``."""
        for d in reversed(self.deletions):
            if d.start <= pos < d.end:
                return d
        return None
