"""The component interface: a few hooks named by phase. The tree core calls these and names no
component; FULL, SWA and MAMBA each implement them in their own module.

Lifetime rules every component follows:
- a device value on an auxiliary component implies a FULL device value on the node, and an
  auxiliary host value implies a FULL host value (FULL is the backbone);
- ``lock_ref``/``host_ref`` are only ever moved by the cache's lock table, so they equal the
  number of live pins;
- match does not pin: callers lock ``last_device_node`` (or the load-back anchor) before use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from radixscope.cache.tiers import DEVICE, HOST
from radixscope.cache.tree import ComponentData, Node

_numel = torch.Tensor.numel
DEV_OK, ANY_OK = 1, 2  # ``path_check``'s bits: a valid match end on device / on device or host


class Component:
    name: str = ""
    priority: int = 0            # internal-node eviction cascade: higher evicts lower
    copies_refs_on_split: bool = True
    uses_lru: bool = True        # FULL uses the evictable-leaf heap instead
    boundary_state: bool = False  # value belongs to the node's end (MAMBA)
    value_cap: int | None = None  # most slots one node's value may hold (SWA: one paged window)
    # ---- what readers of snapshots ask (the explainer, the doctor, the UI) ----------------
    display_name: str = ""       # how reports spell it (FULL, SWA, MAMBA)
    unit: str = "tokens"         # what one slot of its pools holds
    is_backbone: bool = False    # FULL: auxiliary data on a node implies FULL data there
    tombstone_meaning: str = "no data on any tier"  # what a node without its data means
    has_window: bool = False     # SWA: a match end needs an unbroken window behind it
    kv_spec_kind: str | None = None  # the KV-cache spec kind other engines' events name it by

    def __init__(self, index: int, config) -> None:
        self.index = index
        self.config = config
        self.page_size = config.page_size

    # ---- sizes -------------------------------------------------------------------------
    def size(self, value) -> int:
        """Slots a value occupies (tokens for KV components, 1 per state for MAMBA)."""
        return value.numel()

    def size_fn(self) -> Callable[[object], int]:
        """``size`` as the cheapest callable: ``Tensor.numel`` itself (a C call, no Python
        frame) unless a subclass overrides ``size``. For the per-node loops of lock / unlock."""
        return _numel if type(self).size is Component.size else self.size

    # ---- split phase ----------------------------------------------------------------------
    def split(self, child: ComponentData, new: ComponentData, k: int) -> None:
        """Redistribute ``child``'s data when its first ``k`` tokens move to the new parent."""
        cv, nv = child.values, new.values
        for t, v in enumerate(cv):
            if v is not None:
                nv[t], cv[t] = v[:k], v[k:]
        if self.copies_refs_on_split:
            new.refs[:] = child.refs

    # ---- match phase -----------------------------------------------------------------------
    def path_check(self) -> Callable[[Node], int]:
        """A check fed the matched path top-down, one call a node (match's hot loop): is this
        node a valid match end? A bitmask: ``DEV_OK`` counting device data only, ``ANY_OK``
        counting host data too. Default: the component holds data on the node. Stateful
        components (SWA) override it; ``validator`` is built on it."""
        i = self.index

        def check(node: Node) -> int:
            v = node.data[i].values
            if v[DEVICE] is not None:
                return DEV_OK | ANY_OK
            return ANY_OK if v[HOST] is not None else 0
        return check

    def validator(self, host_ok: bool) -> Callable[[Node], bool]:
        """``path_check`` as a predicate: a valid match end on device (or, with ``host_ok``,
        counting host data too)."""
        check = self.path_check()
        bit = ANY_OK if host_ok else DEV_OK

        def valid(node: Node) -> bool:
            return bool(check(node) & bit)
        return valid

    @classmethod
    def valid_prefix(cls, steps: Iterable[tuple[bool, int]], *, window: int | None = None
                     ) -> list[bool]:
        """The match rule on plain data (what ``validator`` decides on live nodes, for readers
        of snapshots such as the miss explainer): per step of a matched path, top-down, given
        whether this component holds data there (on the tiers that count) and how many tokens
        the step matched, is it a valid match end? Default: it holds data. ``window`` is the
        configured sliding window (components without one ignore it)."""
        return [has for has, _k in steps]

    # ---- recency phase -------------------------------------------------------------------
    def recency_span(self, path: list[Node]) -> int:
        """How many nodes of a touched path (bottom-up) this component's recency list
        refreshes. Default: the whole path."""
        return len(path)

    # ---- lock phase ------------------------------------------------------------------------
    def lock_pins(self, path: list[Node]) -> list[Node]:
        """Nodes a device lock pins, given the path bottom-up from the effective anchor."""
        raise NotImplementedError

    # ---- load-back phase -------------------------------------------------------------------
    def load_plan(self, path: list[Node]) -> tuple[list[Node], int | None]:
        """Host-only nodes to load for a load-back anchored at ``path[0]`` (bottom-up), and
        optionally the number of tokens at which ``path``'s last listed node must be cut (the
        window boundary) so only whole in-window pages load. Returns (nodes, cut)."""
        raise NotImplementedError

    def host_hit_length(self, path: list[Node]) -> int:
        """Slots a load-back anchored at ``path[0]`` (bottom-up path) would allocate."""
        nodes, cut = self.load_plan(path)
        total = sum(self.size(n.data[self.index].values[HOST]) for n in nodes)
        if cut is not None and nodes:
            total -= len(nodes[-1].key) - cut
        return total
