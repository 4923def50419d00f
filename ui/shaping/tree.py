"""The radix tree of one snapshot as a table plus a child index: the model every tree view reads.

``tree_model(snapshot)`` is one pass over the nodes (a preorder walk for depths and prefix
lengths, its reverse for subtree sums), so a 100k-node snapshot costs a fraction of a second.
``TreeModel.frame`` holds one row per node (index ``node_id``):

| column                | meaning                                                            |
|-----------------------|--------------------------------------------------------------------|
| ``parent_id``         | parent node id (-1 for the root)                                   |
| ``depth``             | edges from the root (root 0)                                       |
| ``tokens``            | the node's own key length                                          |
| ``prefix_end``        | tokens from the root through this node (its prefix length)         |
| ``subtree_tokens``    | tokens in the node and all its descendants                         |
| ``subtree_nodes``     | nodes in the subtree, the node included                            |
| ``n_children``        | direct children                                                    |
| ``last_access``       | recency tick; ``hits`` the hit count                               |
| ``extra_key``         | namespace (``None`` for the default one), as text                  |
| ``state_<c>``         | display state of component ``c`` (``ui.shaping.states``)           |
| ``dev_<c>``/``host_<c>`` | length on the device / host tier (-1 = no value there)          |
| ``sto_<c>``           | length in L3 storage (tokens; 1 for a MAMBA state; -1 = not there) |
| ``lock_<c>``/``href_<c>`` | lock_ref / host_ref of component ``c``                         |
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import pandas as pd

from radixscope.cache.snapshot import CacheSnapshot
from radixscope.cache.tiers import Tier
from radixscope.telemetry.analysis.doctor import unit_of
from radixscope.ui.shaping import states as st_

ROOT_ID = 0


@dataclass(frozen=True)
class TreeModel:
    """One snapshot's tree, shaped for drawing. Treat every field as read-only.

    ``frame`` is sorted by node id; ``child_order[child_start[i]:child_start[i + 1]]`` are the
    row positions of row ``i``'s children, largest subtree first (ties by node id).
    """

    seq: int
    page_size: int
    components: tuple[str, ...]
    frame: pd.DataFrame
    ids: np.ndarray
    child_order: np.ndarray
    child_start: np.ndarray

    @property
    def n_nodes(self) -> int:
        return len(self.ids)

    @property
    def total_tokens(self) -> int:
        return int(self.frame["subtree_tokens"].iat[0])

    def row(self, node_id: int) -> int:
        """Row position of ``node_id`` in ``frame``; ValueError naming it when absent."""
        if isinstance(node_id, (bool, np.bool_)) or not isinstance(node_id, (int, np.integer)):
            raise ValueError(f"node {node_id!r} is not a node id (an int)")
        i = int(np.searchsorted(self.ids, node_id))
        if i >= len(self.ids) or self.ids[i] != node_id:
            raise ValueError(f"node {node_id!r} is not in the tree at seq {self.seq} "
                             f"({self.n_nodes} nodes)")
        return i

    def has(self, node_id: int) -> bool:
        i = int(np.searchsorted(self.ids, node_id))
        return i < len(self.ids) and self.ids[i] == node_id

    def check_node(self, node_id: object) -> int:
        """``node_id`` as an int if the tree has it, else ValueError naming it."""
        return int(self.ids[self.row(node_id)])  # type: ignore[arg-type]

    def children(self, node_id: int) -> list[int]:
        """Child node ids, largest subtree first."""
        i = self.row(node_id)
        rows = self.child_order[self.child_start[i]:self.child_start[i + 1]]
        return self.ids[rows].tolist()

    def path_to_root(self, node_id: int) -> list[int]:
        """``[node_id, parent, ..., 0]``."""
        parent = self.frame["parent_id"].to_numpy()
        i = self.row(node_id)
        out = [int(self.ids[i])]
        while out[-1] != ROOT_ID:
            i = int(np.searchsorted(self.ids, parent[i]))
            out.append(int(self.ids[i]))
        return out


def tree_model(snap: CacheSnapshot) -> TreeModel:
    """Shape a snapshot into a ``TreeModel`` (vectorised; ~0.3 s at 100k nodes).

    Raises:
        ValueError: the snapshot has no root (node 0), a parent is missing, or a node is not
            reachable from the root.
    """
    nodes = snap.nodes
    n = len(nodes)
    if not n or nodes[0].node_id != ROOT_ID:
        raise ValueError(f"snapshot at seq {snap.seq} has no root node 0")
    ids = np.fromiter((x.node_id for x in nodes), dtype=np.int64, count=n)
    parent_ids = np.fromiter((-1 if x.parent_id is None else x.parent_id for x in nodes),
                             dtype=np.int64, count=n)
    ppos = np.searchsorted(ids, parent_ids[1:])
    ppos = np.minimum(ppos, n - 1)
    bad = ids[ppos] != parent_ids[1:]
    if bad.any():
        k = int(np.argmax(bad)) + 1
        raise ValueError(f"node {int(ids[k])} has parent {int(parent_ids[k])}, which is not in "
                         f"the snapshot at seq {snap.seq}")
    parent_pos = np.concatenate(([-1], ppos)).astype(np.int64)
    tokens = np.fromiter((len(x.tokens) for x in nodes), dtype=np.int64, count=n)
    depth = np.zeros(n, dtype=np.int64)
    anc = parent_pos.copy()
    live = anc >= 0
    n_live = int(live.sum())
    while n_live:  # pointer walk: every node steps one ancestor up per round
        depth += live
        anc = np.where(live, parent_pos[np.maximum(anc, 0)], -1)
        live = anc >= 0
        left = int(live.sum())
        if left == n_live:  # in a tree some node reaches the root every round
            raise ValueError(f"snapshot at seq {snap.seq}: parent links form a cycle (nodes "
                             f"{ids[live][:8].tolist()} never reach the root)")
        n_live = left
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
    levels = [by_depth[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]
    prefix = tokens.copy()
    for lv in levels[1:]:
        prefix[lv] += prefix[parent_pos[lv]]
    sub_tok = tokens.copy()
    sub_n = np.ones(n, dtype=np.int64)
    for lv in reversed(levels[1:]):
        np.add.at(sub_tok, parent_pos[lv], sub_tok[lv])
        np.add.at(sub_n, parent_pos[lv], sub_n[lv])
    child_order = np.lexsort((ids[1:], -sub_tok[1:], parent_pos[1:])) + 1
    child_start = np.searchsorted(parent_pos[child_order], np.arange(n + 1))
    cols: dict[str, object] = {
        "parent_id": parent_ids, "depth": depth, "tokens": tokens, "prefix_end": prefix,
        "subtree_tokens": sub_tok, "subtree_nodes": sub_n,
        "n_children": np.diff(child_start),
        "last_access": np.fromiter((x.last_access for x in nodes), dtype=np.int64, count=n),
        "hits": np.fromiter((x.hit_count for x in nodes), dtype=np.int64, count=n),
        "extra_key": [None if x.extra_key is None else str(x.extra_key) for x in nodes],
    }
    flying = _in_flight(snap)
    k = len(snap.components)
    flat = [c for x in nodes for c in x.components]  # one pass; fields are read per column
    dev = _field(flat, "device_len", n, k)
    host = _field(flat, "host_len", n, k)
    lock = _field(flat, "lock_ref", n, k)
    href = _field(flat, "host_ref", n, k)
    sto = _storage_lens(flat, n, k)
    for ci, comp in enumerate(snap.components):
        cols[f"state_{comp}"] = _states(dev[:, ci], host[:, ci], sto[:, ci], lock[:, ci],
                                        href[:, ci], ids, flying.get(comp, set()),
                                        dev[:, 0] >= 0 if ci and unit_of(comp) == "tokens"
                                        else None)
        cols[f"dev_{comp}"] = dev[:, ci]
        cols[f"host_{comp}"] = host[:, ci]
        cols[f"sto_{comp}"] = sto[:, ci]
        cols[f"lock_{comp}"] = lock[:, ci]
        cols[f"href_{comp}"] = href[:, ci]
    frame = pd.DataFrame(cols, index=pd.Index(ids, name="node_id"))
    return TreeModel(snap.seq, snap.page_size, snap.components, frame, ids, child_order,
                     child_start)


def _in_flight(snap: CacheSnapshot) -> dict[str, set[int]]:
    """Component -> node ids touched by a transfer still in flight for that component."""
    out: dict[str, set[int]] = {}
    for t in snap.transfers:
        for comp, amount in t.amounts:
            if amount > 0:
                out.setdefault(comp, set()).update(t.node_ids)
    return out


_CODE = {s: i for i, s in enumerate(st_.STATES)}


def _field(flat: list, name: str, n: int, k: int) -> np.ndarray:
    """One ``ComponentState`` field of every node as an ``(n, k)`` int array (None -> -1)."""
    get = attrgetter(name)
    out = np.fromiter((-1 if (v := get(c)) is None else v for c in flat), dtype=np.int64,
                      count=n * k)
    return out.reshape(n, k)


def _storage_lens(flat: list, n: int, k: int) -> np.ndarray:
    """Every node's L3 length per component as an ``(n, k)`` int array (None -> -1)."""
    t = Tier.STORAGE
    out = np.fromiter((-1 if (v := c.length(t)) is None else v for c in flat), dtype=np.int64,
                      count=n * k)
    return out.reshape(n, k)


def _stored(code: np.ndarray, on_sto: np.ndarray) -> np.ndarray:
    """Codes of nodes with an L3 copy moved to their storage-family state."""
    out = code.copy()
    for plain in (st_.DEVICE, st_.BOTH, st_.HOST_ONLY, st_.TOMBSTONE, st_.FULL_KEPT):
        sel = on_sto & (code == _CODE[plain])
        out[sel] = _CODE[st_.stored_state(plain, True)]
    return out


def _states(dev: np.ndarray, host: np.ndarray, sto: np.ndarray, lock: np.ndarray,
            href: np.ndarray, ids: np.ndarray, flying: set[int], full_dev: np.ndarray | None
            ) -> pd.Categorical:
    """Display-state codes; ``full_dev`` (auxiliary components) marks nodes whose FULL is on
    device, where a tombstone is drawn as ``FULL_KEPT``; an L3 copy (``sto``) moves a node to
    the storage colour family."""
    on_dev, on_host = dev >= 0, host >= 0
    gone = _CODE[st_.TOMBSTONE] if full_dev is None else np.where(
        full_dev, _CODE[st_.FULL_KEPT], _CODE[st_.TOMBSTONE])
    code = np.where(on_dev, np.where(on_host, _CODE[st_.BOTH], _CODE[st_.DEVICE]),
                    np.where(on_host, _CODE[st_.HOST_ONLY], gone))
    code = _stored(code, sto >= 0)
    code[(lock > 0) | (href > 0)] = _CODE[st_.LOCKED]
    if flying:
        code[np.isin(ids, np.fromiter(flying, dtype=np.int64))] = _CODE[st_.IN_FLIGHT]
    code[0] = _CODE[st_.ROOT]
    return pd.Categorical.from_codes(code, categories=list(st_.STATES))


def state_summary(model: TreeModel, component: str) -> pd.DataFrame:
    """Nodes and own tokens per display state of ``component`` (root excluded), legend order.

    Returns:
        Columns ``state``, ``color``, ``nodes``, ``tokens``; states with no node are omitted.
    """
    if component not in model.components:
        raise ValueError(f"component {component!r} is not in this tree; have "
                         f"{list(model.components)}")
    f = model.frame.drop(index=ROOT_ID)
    g = f.groupby(f"state_{component}")["tokens"].agg(["size", "sum"])
    rows = [(s, st_.COLORS[s], int(g.at[s, "size"]), int(g.at[s, "sum"]))
            for s in st_.STATES if s in g.index]
    return pd.DataFrame(rows, columns=["state", "color", "nodes", "tokens"])


def node_label(model: TreeModel, node_id: int) -> str:
    """Short text naming a node: ``#12 · 48 tok``."""
    model.check_node(node_id)
    if node_id == ROOT_ID:
        return "root"
    return f"#{node_id} · {int(model.frame.at[node_id, 'tokens'])} tok"
