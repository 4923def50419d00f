"""Sliding-window KV: a match end is valid only with an unbroken window of SWA data behind it.

The window is ``W = config.sliding_window`` tokens; it need not be a multiple of the page size
(a lock or load-back covers ``ceil_paged(W)``). A fresh leaf carries SWA only on its last
``ceil_paged(W)`` tokens (insert splits off a FULL-only part), so no node holds more than one
paged window of SWA. Nodes outside every live window may be tombstoned (SWA value None while
FULL stays), leaves included: SWA pressure never deletes FULL data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from radixscope.cache.components.base import ANY_OK, DEV_OK, Component
from radixscope.cache.keys import ceil_paged
from radixscope.cache.tiers import DEVICE, HOST
from radixscope.cache.tree import Node


class SwaComponent(Component):
    name = "swa"
    priority = 1
    display_name = "SWA"
    has_window = True
    kv_spec_kind = "sliding_window"
    tombstone_meaning = ("its sliding-window KV was dropped (SWA pressure, or outside every live "
                         "window) while FULL stays; an insert heals it")

    def __init__(self, index: int, config) -> None:
        super().__init__(index, config)
        self.window = config.sliding_window
        self.window_paged = ceil_paged(self.window, config.page_size)
        self.value_cap = self.window_paged  # fresh leaves are capped, heals stay in the window

    def path_check(self):
        """``_window_rule`` on two runs at once, inlined (one call a node of every match): the
        unbroken run of SWA data behind the node on device, and on device or host."""
        i, window = self.index, self.window
        dev = both = float("inf")  # the root's side needs no window

        def check(node: Node) -> int:
            nonlocal dev, both
            v = node.data[i].values
            k = len(node.key)
            if v[DEVICE] is not None:
                dev += k
                both += k
            elif v[HOST] is not None:
                dev = 0
                both += k
            else:
                dev = both = 0
                return 0
            return (DEV_OK if dev >= window else 0) | (ANY_OK if both >= window else 0)
        return check

    @classmethod
    def valid_prefix(cls, steps: Iterable[tuple[bool, int]], *, window: int | None = None
                     ) -> list[bool]:
        if window is None:
            raise ValueError("the SWA match rule needs the sliding window")
        step = _window_rule(window)
        return [step(has, k) for has, k in steps]

    def recency_span(self, path: list[Node]) -> int:
        """Only the live window (plus one page) is refreshed, so SWA data further up goes cold
        and is tombstoned first."""
        return len(self.lock_pins(path, self.window + self.page_size))

    def lock_pins(self, path: list[Node], window: int | None = None) -> list[Node]:
        """One window upward from the anchor, tombstones included in the count."""
        out, covered, w = [], 0, self.window if window is None else window
        for node in path:
            if covered >= w:
                break
            out.append(node)
            covered += len(node.key)
        return out

    def load_plan(self, path: list[Node]) -> tuple[list[Node], int | None]:
        """Host-only SWA nodes inside the window behind the anchor. A node straddling the window
        start is cut so only its last whole in-window pages load (``cut`` = tokens kept)."""
        i, need = self.index, self.window_paged
        out: list[Node] = []
        covered = 0
        cut = None
        for node in path:
            if covered >= self.window:
                break
            d = node.data[i]
            n = len(node.key)
            if d.values[DEVICE] is None and d.values[HOST] is not None:
                out.append(node)
                if covered + n > need:
                    cut = need - covered
            elif d.values[DEVICE] is None:
                break  # a tombstone: the anchor would not have validated; nothing more to load
            covered += n
        return out, cut


def _window_rule(window: int) -> Callable[[bool, int], bool]:
    """The SWA match rule, one step at a time (top-down): a node is a valid match end only with
    an unbroken run of at least ``window`` tokens of SWA data ending there. The run is
    unbounded until the first gap (the root's side needs no window)."""
    run = [float("inf")]

    def step(has: bool, k: int) -> bool:
        if has:
            run[0] += k
            return run[0] >= window
        run[0] = 0
        return False
    return step
