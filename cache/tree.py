"""The radix tree's structure: nodes, per-component data slots, child lookup, split, detach.

The tree knows keys and integer ids only; it names no component and touches no memory. State
rules (what a split does to each component, who may be evicted) live in ``components/``; the
executor in ``hiradix.py`` applies them.
"""

from __future__ import annotations

from array import array

import torch

from radixscope.cache.keys import child_key, empty_key
from radixscope.cache.native import common_len, untrack
from radixscope.cache.tiers import per_tier

ROOT_ID = 0


class ComponentData:
    """One component's state on one node, indexed by ``Tier``: ``values[t]`` the slot indices
    held on tier ``t`` (None: nothing there), ``refs[t]`` the pins on it (the lock ref on
    DEVICE, the host ref on HOST).

    Neither it nor its lists are tracked by the garbage collector (``native.untrack``): they
    hold slot tensors, ``StoredPages`` and ints, none of which refers back, so no cycle can
    pass through them. Keep it so: a value that could refer to a node would make a cycle the
    collector cannot see."""

    __slots__ = ("values", "refs")

    def __init__(self) -> None:
        self.values: list[torch.Tensor | None] = per_tier(None)
        self.refs: list[int] = per_tier(0)
        untrack(self.values, self.refs, self)


class Node:
    """One node. The garbage collector tracks the node and its ``children`` dict (parent and
    children refer to each other: a tree dropped with its cache is a cycle to collect) and the
    device value's tensor; its key, ``data`` list and component data are untracked
    (``native.untrack``; ``ComponentData``): three objects a FULL node for a collection to
    scan, not eight."""

    __slots__ = ("id", "parent", "children", "key", "extra_key", "last_access", "hit_count",
                 "data", "device_children")

    def __init__(self, node_id: int, parent: Node | None, key: array, extra_key: object,
                 n_components: int) -> None:
        self.id = node_id
        self.parent = parent
        self.children: dict[object, Node] = {}
        self.key = key
        self.extra_key = extra_key
        self.last_access = 0
        self.hit_count = 0
        self.data = data = [ComponentData() for _ in range(n_components)]
        untrack(key, data)  # the list holds ComponentData only; a key holds ints
        # children whose FULL (component 0) has a device value: D-leaf test in O(1)
        self.device_children = 0

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        return f"Node(id={self.id}, len={len(self.key)}, children={len(self.children)})"


class RadixTree:
    """Node registry, child filing and the structural edits. Ids are never reused."""

    def __init__(self, page_size: int, n_components: int) -> None:
        self.page_size = page_size
        self.n_components = n_components
        self.root = Node(ROOT_ID, None, empty_key(), None, n_components)
        self.nodes: dict[int, Node] = {ROOT_ID: self.root}
        self._next_id = ROOT_ID + 1

    def get(self, node_id: int) -> Node:
        node = self.nodes.get(node_id)
        if node is None:
            raise KeyError(node_id)
        return node

    def file_key(self, parent: Node, tokens: array, offset: int, extra_key: object):
        ck = child_key(tokens, offset, self.page_size)
        return (extra_key, ck) if parent.parent is None else ck

    def descend(self, node: Node, tokens: array, off: int, extra_key: object
                ) -> tuple[Node, int] | None:
        """The child of ``node`` that ``tokens[off:]`` enters and how many of its tokens match
        (page-rounded, > 0), or None. No mutation. The one descent step every walk uses
        (match, insert, the insert guard): the key compare is ``native.common_len``, one C
        pass over the two buffers (no slice copies)."""
        ps = self.page_size
        ck = tokens[off] if ps == 1 else tuple(tokens[off:off + ps])
        child = node.children.get((extra_key, ck) if node.parent is None else ck)
        if child is None:
            return None
        key = child.key
        k = common_len(tokens, off, key)
        if k < len(key):
            k -= k % ps
            if not k:
                return None
        return child, k

    def walk(self, tokens: array, extra_key: object):
        """Yield ``(node, matched)`` down the path of ``tokens``: each child visited and how many
        of its tokens match (a partial match is the last one yielded). No mutation."""
        node, off, n = self.root, 0, len(tokens)
        while off < n:
            step = self.descend(node, tokens, off, extra_key)
            if step is None:
                return
            child, k = step
            yield child, k
            if k < len(child.key):
                return
            node, off = child, off + k

    def new_child(self, parent: Node, key: array, extra_key: object) -> Node:
        node = Node(self._next_id, parent, key, extra_key, self.n_components)
        self._next_id += 1
        parent.children[self.file_key(parent, key, 0, extra_key)] = node
        self.nodes[node.id] = node
        return node

    def split(self, child: Node, k: int) -> Node:
        """Put a new node holding ``child.key[:k]`` between child and its parent. The child keeps
        its id; the new node copies recency. Component data is left empty for the caller."""
        parent = child.parent
        assert parent is not None and 0 < k < len(child.key)
        new = Node(self._next_id, parent, child.key[:k], child.extra_key, self.n_components)
        self._next_id += 1
        new.last_access = child.last_access
        new.hit_count = child.hit_count
        parent.children[self.file_key(parent, child.key, 0, child.extra_key)] = new
        child.key = key = child.key[k:]
        untrack(key)
        child.parent = new
        new.children[self.file_key(new, child.key, 0, child.extra_key)] = child
        self.nodes[new.id] = new
        return new

    def detach(self, node: Node) -> None:
        """Remove a childless node from the tree."""
        assert not node.children and node.parent is not None
        parent = node.parent
        del parent.children[self.file_key(parent, node.key, 0, node.extra_key)]
        del self.nodes[node.id]

    def path_to_root(self, node: Node) -> list[Node]:
        """``node`` and its ancestors, bottom-up, without the root."""
        out = []
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out

    def prefix_len(self, node: Node) -> int:
        n = 0
        while node.parent is not None:
            n += len(node.key)
            node = node.parent
        return n
