"""Another engine's KV events -> its resident blocks per (medium, group), and a journal.

``EngineTree.apply`` takes one decoded batch (``wire.decode_batch``) and updates the blocks
resident per (medium, group). Every block is also a node of a tree whose mutations are in our
journal format (``node.create`` / ``comp.state`` / ``node.delete``, one component per group,
device = ``GPU``, host = a CPU medium), so a store written from them opens in the UI like our
own cache's. A block stays a (tombstone) node while a child still needs it. Media: ``GPU`` is
the device tier; ``CPU`` (vLLM) and ``CPU_PINNED`` (SGLang) the host tier; ``DISK`` /
``EXTERNAL`` (SGLang) and ``STORAGE`` (vLLM) the storage tier; anything else is kept in
``blocks`` and counted, with no tier in the tree.

The block size and the groups are learned from the events (the first ``BlockStored`` of each
group), so the tree's shape is not known when the watcher attaches: each time it changes the
tree queues a keyframe at the seq it changed at (``take``). The block size is always learned
before the first mutation, so it holds from seq 0. A group's kind and window are known only
where the engine publishes them (vLLM's ``kv_cache_spec_kind``); SGLang publishes neither, nor a
``group_idx`` (its events are the FULL group's pages only): such a group is ``full``.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

from radixscope.cache.components import BACKBONE, KV_SPEC_KINDS
from radixscope.cache.tiers import Tier, per_tier
from radixscope.telemetry.kvevents.blocks import STORAGE_MEDIUM_NAMES
from radixscope.telemetry.kvevents.wire import Cleared, Decoded, Removed, Stored

MEDIUM_TIERS = {"GPU": "device", "CPU": "host", "CPU_PINNED": "host",
                **dict.fromkeys(STORAGE_MEDIUM_NAMES, "storage")}
_SLOT = {lbl: Tier.of(lbl) for lbl in dict.fromkeys(MEDIUM_TIERS.values())}
GROUP_COMPONENTS = {kind: name for name, kind in KV_SPEC_KINDS.items()}


class Resident(NamedTuple):
    parent: int | None
    tokens: tuple[int, ...]
    seq: int  # journal seq at which it was stored
    ts_ns: int


class BlockChange(NamedTuple):
    """A row for the store's ``kv_blocks`` table: stored (``removed`` False) or removed."""

    removed: bool
    medium: str
    group: int
    hash: int
    parent: int | None
    tokens: tuple[int, ...]
    seq: int
    ts_ns: int


class EngineTree:
    """The blocks an engine holds, from its events.

    Args:
        components: component names per group index (grown as groups appear, up to 8).

    Mutates (``apply``): the resident blocks, the pending journal mutations, block changes and
    keyframes (a keyframe when the block size is learned or a group appears; the empty tree's
    at construction), all drained by ``take``.
    """

    MAX_GROUPS = 8

    def __init__(self, components: tuple[str, ...] = (BACKBONE,)) -> None:
        self.components = list(components)
        self.block_size: int | None = None
        self.resident: dict[tuple[str, int], dict[int, Resident]] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.seq = 0
        self.mutations: list[tuple] = []  # journal tuples since the last take
        self.changes: list[BlockChange] = []
        # per group: the spec kind and sliding window as published (None: not published)
        self.group_specs: list[tuple[str | None, int | None]] = [(None, None)] * len(components)
        self._nid: dict[int, int] = {}  # block hash -> node id
        # nid -> [hash, children, parent nid, {group: [device len, host len]}, tokens]
        self._node: dict[int, list] = {0: [None, 0, None, {}, ()]}
        self._next = 1
        self.keyframes: list[dict] = [self.keyframe_dict()]  # the empty tree: seq 0 rebuilds

    # ---- events -------------------------------------------------------------------------------
    def apply(self, batch: Decoded, ts_ns: int) -> None:
        """Apply one batch; a bad event is counted and skipped (never raised)."""
        self.counts["unknown_events"] += batch.unknown
        for e in batch.events:
            if isinstance(e, Stored):
                self._stored(e, ts_ns)
            elif isinstance(e, Removed):
                self._removed(e, ts_ns)
            elif isinstance(e, Cleared):
                self.counts["AllBlocksCleared"] += 1
                for (medium, group), blocks in list(self.resident.items()):
                    self._drop(medium, group, list(blocks), ts_ns)

    def _stored(self, e: Stored, ts_ns: int) -> None:
        if e.group >= self.MAX_GROUPS:
            self.counts["bad_group"] += 1
            return
        if self.block_size is not None and e.block_size != self.block_size:
            self.counts["bad_block_size"] += 1
            return
        learned = self.block_size is None
        self.block_size = e.block_size
        while len(self.components) <= e.group:
            name = GROUP_COMPONENTS.get(e.kind or "", f"group{len(self.components)}")
            if name in self.components:
                name = f"group{len(self.components)}"
            self.components.append(name)
            self.group_specs.append((None, None))
            learned = True
        if self.group_specs[e.group] == (None, None) and (e.kind or e.window) is not None:
            self.group_specs[e.group] = (e.kind, e.window)
        if learned:
            self._shape_changed()
        self.counts["BlockStored"] += 1
        key = (e.medium, e.group)
        blocks = self.resident.setdefault(key, {})
        bs = self.block_size
        parent = e.parent
        for i, h in enumerate(e.hashes):
            toks = e.tokens[i * bs:(i + 1) * bs]
            self.counts["stored_blocks"] += 1
            if h not in blocks:
                self.seq_node(h, parent, toks)
                blocks[h] = Resident(parent, toks, self.seq, ts_ns)
                self._set(h, e.medium, e.group, True)
                self.changes.append(BlockChange(False, e.medium, e.group, h, parent, toks,
                                                self.seq, ts_ns))
            parent = h

    def _removed(self, e: Removed, ts_ns: int) -> None:
        self.counts["BlockRemoved"] += 1
        keys = ([(e.medium, e.group)] if e.group is not None else
                [k for k in self.resident if k[0] == e.medium])
        for h in e.hashes:
            self.counts["removed_blocks"] += 1
            hit = [k for k in keys if h in self.resident.get(k, {})]
            if not hit:
                self.counts["unknown_removed"] += 1
            for k in hit:
                self._drop(k[0], k[1], [h], ts_ns)

    def _drop(self, medium: str, group: int, hashes: list[int], ts_ns: int) -> None:
        blocks = self.resident[(medium, group)]
        for h in hashes:
            r = blocks.pop(h)
            self._set(h, medium, group, False)
            self.changes.append(BlockChange(True, medium, group, h, r.parent, r.tokens,
                                            self.seq, ts_ns))
            self._collect(self._nid.get(h))

    # ---- the journal ----------------------------------------------------------------------
    def _m(self, kind: str, node: int, comp: str | None, value: object) -> None:
        self.seq += 1
        self.mutations.append((self.seq, 0, kind, node, comp, None, value))

    def seq_node(self, h: int, parent: int | None, toks: tuple[int, ...]) -> int:
        nid = self._nid.get(h)
        if nid is not None:
            return nid
        pid = self._nid.get(parent, 0) if parent is not None else 0
        nid = self._next
        self._next += 1
        self._nid[h] = nid
        self._node[nid] = [h, 0, pid, {}, toks]
        self._node[pid][1] += 1
        self._m("node.create", nid, None, (pid, None, list(toks)))
        return nid

    def _set(self, h: int, medium: str, group: int, on: bool) -> None:
        tier = MEDIUM_TIERS.get(medium)
        if tier is None:
            self.counts[f"medium_without_tier.{medium}"] += int(on)
            return
        nid = self._nid[h]
        held: dict = self._node[nid][3]
        state = held.setdefault(group, per_tier(None))
        state[_SLOT[tier]] = self.block_size if on else None
        self._m("comp.state", nid, self.components[group], (tuple(state), tuple(per_tier(0))))

    def _collect(self, nid: int | None) -> None:
        """Delete a node that holds nothing and has no children, then its parents likewise."""
        while nid:
            rec = self._node[nid]
            if rec[1] or any(v is not None for st in rec[3].values() for v in st):
                return
            h = rec[0]
            if any(h in b for b in self.resident.values()):
                return
            del self._node[nid]
            del self._nid[h]
            self._m("node.delete", nid, None, None)
            pid = rec[2]
            self._node[pid][1] -= 1
            nid = pid

    def _shape_changed(self) -> None:
        """The block size or the groups changed at this seq: queue the tree now as a keyframe
        (replacing one queued at the same seq), so every seq from here rebuilds with them."""
        kf = self.keyframe_dict()
        if self.keyframes and self.keyframes[-1]["seq"] == kf["seq"]:
            self.keyframes[-1] = kf
        else:
            self.keyframes.append(kf)

    def keyframe_dict(self) -> dict:
        """The tree now as a ``CacheSnapshot.to_dict()`` (pool capacities are unknown: 0)."""
        comps = self.components
        nodes = []
        for nid, (_h, _n, pid, held, toks) in sorted(self._node.items()):
            states = [[list(held.get(g) or per_tier(None)), per_tier(0)] for g in range(len(comps))]
            nodes.append([nid, pid, None, list(toks), 0, 0, states])
        pools = []
        for c in comps:
            for tier, slot in _SLOT.items():
                used = sum(1 for rec in self._node.values()
                           for g, st in rec[3].items() if comps[g] == c and st[slot] is not None)
                pools.append([c, tier, 0, 0, used * (self.block_size or 1), 0, 0])
        return {"seq": self.seq, "page_size": self.block_size or 1, "components": list(comps),
                "nodes": nodes, "pools": pools, "locks": [], "transfers": []}

    def take(self) -> tuple[list[tuple], list[BlockChange], list[dict]]:
        """The journal mutations, block changes and keyframes (in seq order; a keyframe at
        seq S is the tree after mutation S) since the last call."""
        m, c, k = self.mutations, self.changes, self.keyframes
        self.mutations, self.changes, self.keyframes = [], [], []
        return m, c, k

    def resident_counts(self) -> dict[str, int]:
        out: collections.Counter[str] = collections.Counter()
        for (medium, _g), blocks in self.resident.items():
            out[medium] += len(blocks)
        return dict(out)
