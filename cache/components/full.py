"""FULL attention KV: one slot per token, device copies prefix-closed, path-to-root locks."""

from __future__ import annotations

from radixscope.cache.components.base import Component
from radixscope.cache.tiers import DEVICE
from radixscope.cache.tree import Node


class FullComponent(Component):
    name = "full"
    priority = 2
    uses_lru = False
    display_name = "FULL"
    is_backbone = True
    kv_spec_kind = "full_attention"
    tombstone_meaning = "a dead node: FULL holds no data on any tier (an invariant violation)"

    def lock_pins(self, path: list[Node]) -> list[Node]:
        return path  # the whole device-resident path to the root

    def load_plan(self, path: list[Node]) -> tuple[list[Node], int | None]:
        """The evicted bottom segment under the anchor: walk up while FULL is host-only."""
        i = self.index
        out = []
        for node in path:
            if node.data[i].values[DEVICE] is not None:
                break
            out.append(node)
        return out, None
