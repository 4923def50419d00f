"""The display states a node's component can be drawn in, their colours and their words.

``radixscope.cache.snapshot.ComponentState.state`` says where the data lives (device, host, both, nowhere);
the UI adds two overriding states: *in flight* (a transfer that touches the node for that
component has not been acked) and *locked* (a device lock or a host reference pins it).
"""

from __future__ import annotations

from radixscope.cache.components import BACKBONE, rules
from radixscope.cache.snapshot import (
    STATE_BOTH,
    STATE_DEVICE,
    STATE_HOST,
    STATE_TOMBSTONE,
    ComponentState,
)

DEVICE = "device"
BOTH = "device+host"
HOST_ONLY = "host-only"
TOMBSTONE = "tombstone"
# auxiliary data dropped (its own pressure, or outside the window) while the backbone stays on device
FULL_KEPT = f"tombstone, {rules(BACKBONE).display_name} kept"
LOCKED = "locked"
IN_FLIGHT = "in flight"
ROOT = "root"
FOLDED = "folded"

#: Legend order: most "active" first.
STATES = (IN_FLIGHT, LOCKED, DEVICE, BOTH, HOST_ONLY, FULL_KEPT, TOMBSTONE, ROOT, FOLDED)

COLORS: dict[str, str] = {
    DEVICE: "#2a9d8f",
    BOTH: "#3d6fb6",
    HOST_ONLY: "#e9b949",
    FULL_KEPT: "#a8dadc",
    TOMBSTONE: "#d7dbe0",
    LOCKED: "#e4572e",
    IN_FLIGHT: "#9b5de5",
    ROOT: "#343a40",
    FOLDED: "#f1f3f5",
}

MEANING: dict[str, str] = {
    DEVICE: "data on the device tier only",
    BOTH: "data on the device tier with a host copy",
    HOST_ONLY: "evicted from the device; a host copy remains (load-back possible)",
    FULL_KEPT: ("an SWA window / MAMBA state tombstone: this component's data was dropped (its "
                "own pressure, or outside the window) while the node's FULL KV stays on device; "
                "it still serves the FULL prefix, and an insert heals it"),
    TOMBSTONE: "no data for this component on either tier",
    LOCKED: "pinned by a lock (device) or a host reference: not evictable",
    IN_FLIGHT: "a backup / load-back copy touching it is not acked yet",
    ROOT: "the tree root (no tokens)",
    FOLDED: "small sibling subtrees folded together to keep the drawing light",
}

_BASE = {STATE_DEVICE: DEVICE, STATE_BOTH: BOTH, STATE_HOST: HOST_ONLY,
         STATE_TOMBSTONE: TOMBSTONE}


def display_state(cs: ComponentState, in_flight: bool = False, full_resident: bool = False
                  ) -> str:
    """The state one component of one node is drawn in.

    Args:
        cs: the component's snapshot state on the node.
        in_flight: whether an unacked transfer touches this node for this component.
        full_resident: for an auxiliary component, whether the node's FULL KV is on device (a
            tombstone is then drawn as ``FULL_KEPT``).

    Returns:
        One of ``STATES`` (never ``ROOT`` / ``FOLDED``; those are for synthetic sectors).
    """
    if in_flight:
        return IN_FLIGHT
    if cs.lock_ref > 0 or cs.host_ref > 0:
        return LOCKED
    if full_resident and cs.state == STATE_TOMBSTONE:
        return FULL_KEPT
    return _BASE[cs.state]


def color_of(state: str) -> str:
    """The fill colour of a display state; raises ValueError naming an unknown state."""
    try:
        return COLORS[state]
    except KeyError:
        raise ValueError(f"unknown display state {state!r}; known: {list(COLORS)}") from None


def legend_html(states: list[str] | tuple[str, ...]) -> str:
    """Inline HTML colour chips for ``states`` (``st.markdown(..., unsafe_allow_html=True)``)."""
    chips = []
    for s in states:
        border = "#adb5bd" if s in (TOMBSTONE, FOLDED) else color_of(s)
        chips.append(
            f'<span title="{MEANING[s]}" style="display:inline-block;margin:0 10px 4px 0;'
            f'white-space:nowrap"><span style="display:inline-block;width:12px;height:12px;'
            f'border-radius:3px;background:{color_of(s)};border:1px solid {border};'
            f'vertical-align:-1px;margin-right:5px"></span>{s}</span>')
    return "".join(chips)
