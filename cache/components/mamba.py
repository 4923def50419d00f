"""MAMBA recurrent state: one state slot at a node's *end*; a match needs a state at its end.

A split leaves the new parent without state; locks pin the anchor only; the per-path cap
(``mamba_max_states_per_path``) tombstones the shallowest surplus states after an insert.
"""

from __future__ import annotations

from radixscope.cache.components.base import Component
from radixscope.cache.tiers import DEVICE, HOST
from radixscope.cache.tree import ComponentData, Node


class MambaComponent(Component):
    name = "mamba"
    priority = 0
    copies_refs_on_split = False
    boundary_state = True
    display_name = "MAMBA"
    unit = "states"
    tombstone_meaning = ("no recurrent state at this node's end (by design on most nodes; or "
                         "dropped under MAMBA pressure / the per-path cap) while FULL stays")

    def size(self, value) -> int:
        return 1

    def split(self, child: ComponentData, new: ComponentData, k: int) -> None:
        pass  # the state belongs to the child's end; the new parent gets none

    def lock_pins(self, path: list[Node]) -> list[Node]:
        return path[:1]

    def recency_span(self, path: list[Node]) -> int:
        return min(1, len(path))  # only the state at the match end matters

    def load_plan(self, path: list[Node]) -> tuple[list[Node], int | None]:
        if not path:
            return [], None
        d = path[0].data[self.index]
        return ([path[0]] if d.values[DEVICE] is None and d.values[HOST] is not None else []), None

    def host_hit_length(self, path: list[Node]) -> int:
        return len(self.load_plan(path)[0])
