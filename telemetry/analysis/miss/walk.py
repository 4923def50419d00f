"""The cache's match walk, re-run on a ``CacheSnapshot`` (plain data: no tensors, no cache).

``walk`` follows a key down a snapshot exactly as ``HiRadixCache.match_prefix`` does (same child
filing, whole-page matching, stop at a partial node) and ``judge`` applies each component's
match rule along the path, on the device tier and on device-or-host. The miss explainer compares
the two to say which component stopped a match and where.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixscope.cache.components import rules
from radixscope.cache.snapshot import EMPTY_STATE, CacheSnapshot, ComponentState, NodeSnapshot

STOP_KEY_END = "key_end"        # the whole key matched
STOP_NO_CHILD = "no_child"      # no child starts with the key's next page
STOP_PARTIAL = "partial_node"   # the key diverges inside a node (the match splits it there)
STOP_SUB_PAGE = "sub_page"      # the next node shares fewer tokens than one page


@dataclass(frozen=True)
class Step:
    """One node on the walked path: ``k`` of its ``node_len`` tokens match, from ``start``."""

    node_id: int
    start: int
    k: int
    node_len: int

    @property
    def end(self) -> int:
        return self.start + self.k

    @property
    def partial(self) -> bool:
        return self.k < self.node_len


@dataclass(frozen=True)
class Walk:
    steps: tuple[Step, ...]
    stop: str
    stop_pos: int           # tokens matched structurally (page-rounded)
    common: int             # tokens the next node shares with the key, unrounded (0 if none)
    next_node: int | None   # the node the walk could not (fully) enter, if any


class SnapTree:
    """Child index over a snapshot, filed the way ``radixscope.cache.tree.RadixTree`` files children."""

    def __init__(self, snap: CacheSnapshot) -> None:
        self.snap = snap
        self.page = snap.page_size
        self.by_id: dict[int, NodeSnapshot] = {n.node_id: n for n in snap.nodes}
        self.children: dict[int, dict[object, int]] = {}
        for n in snap.nodes:
            if n.parent_id is not None:
                fk = self._file_key(n.parent_id, n.tokens, 0, n.extra_key)
                self.children.setdefault(n.parent_id, {})[fk] = n.node_id

    def _file_key(self, parent_id: int, tokens: tuple[int, ...], off: int, extra_key: object):
        ck = tokens[off] if self.page == 1 else tuple(tokens[off:off + self.page])
        return (extra_key, ck) if self.by_id[parent_id].parent_id is None else ck

    def namespaces(self) -> list[object]:
        """Namespaces (extra keys) with at least one node."""
        return sorted({fk[0] for fk in self.children.get(0, {})}, key=repr)

    def walk(self, key: tuple[int, ...], extra_key: object) -> Walk:
        """Follow ``key`` (already page-truncated) in namespace ``extra_key``."""
        steps: list[Step] = []
        node, off, n = 0, 0, len(key)
        while off < n:
            child = self.children.get(node, {}).get(self._file_key(node, key, off, extra_key))
            if child is None:
                return Walk(tuple(steps), STOP_NO_CHILD, off, 0, None)
            toks = self.by_id[child].tokens
            common = _common(key, off, toks)
            k = common - common % self.page
            if k == 0:
                return Walk(tuple(steps), STOP_SUB_PAGE, off, common, child)
            steps.append(Step(child, off, k, len(toks)))
            off += k
            if k < len(toks):
                stop = STOP_KEY_END if off == n else STOP_PARTIAL
                return Walk(tuple(steps), stop, off, common, child)
            node = child
        return Walk(tuple(steps), STOP_KEY_END, off, 0, None)

    def path_tokens(self, node_id: int) -> tuple[int, ...]:
        parts = []
        cur = self.by_id[node_id]
        while cur.parent_id is not None:
            parts.append(cur.tokens)
            cur = self.by_id[cur.parent_id]
        return tuple(t for p in reversed(parts) for t in p)


def _common(key: tuple[int, ...], off: int, toks: tuple[int, ...]) -> int:
    n = min(len(key) - off, len(toks))
    i = 0
    while i < n and key[off + i] == toks[i]:
        i += 1
    return i


def state_of(tree: SnapTree, step: Step, comp: str) -> ComponentState:
    """A component's state on a walked node; on a partial node, the state its upper part would
    have after the match splits it (MAMBA state stays with the lower part)."""
    ci = tree.snap.components.index(comp)
    s = tree.by_id[step.node_id].components[ci]
    if step.partial and rules(comp).boundary_state:  # the state stays with the lower part
        return EMPTY_STATE
    return s


def judge(tree: SnapTree, steps: tuple[Step, ...], window: int, host_ok: bool
          ) -> dict[str, list[bool]]:
    """Per component, whether each step is a valid match end (the components' validators)."""
    out: dict[str, list[bool]] = {}
    for comp in tree.snap.components:
        held = []
        for st in steps:
            s = state_of(tree, st, comp)
            held.append((s.device_len is not None or (host_ok and s.host_len is not None), st.k))
        out[comp] = rules(comp).valid_prefix(held, window=window)
    return out


def deepest(oks: dict[str, list[bool]], comps: tuple[str, ...] | None = None) -> int:
    """Index of the deepest step every listed component accepts (-1: none, the root)."""
    names = tuple(oks) if comps is None else comps
    n = len(next(iter(oks.values()))) if oks else 0
    best = -1
    for i in range(n):
        if all(oks[c][i] for c in names):
            best = i
    return best
