"""The display states a node's component can be drawn in, their colours and their words.

``radixscope.cache.snapshot.ComponentState.state`` says where the data lives (device, host,
storage, a combination, nowhere); a copy in L3 storage has its own colour family (storage-only
is the storage colour; with device / host the mix of the two). The UI adds two overriding states: *in flight* (a transfer that touches the node for that
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
from radixscope.cache.tiers import Tier

DEVICE = "device"
BOTH = "device+host"
HOST_ONLY = "host-only"
_L3 = Tier.STORAGE.label
DEVICE_STORED = f"{DEVICE}+{_L3}"
BOTH_STORED = f"{BOTH}+{_L3}"
HOST_STORED = f"{Tier.HOST.label}+{_L3}"
STORAGE_ONLY = f"{_L3}-only"
TOMBSTONE = "tombstone"
# auxiliary data dropped (its own pressure, or outside the window) while the backbone stays on device
FULL_KEPT = f"tombstone, {rules(BACKBONE).display_name} kept"
LOCKED = "locked"
IN_FLIGHT = "in flight"
ROOT = "root"
FOLDED = "folded"

#: Legend order: most "active" first.
STATES = (IN_FLIGHT, LOCKED, DEVICE, DEVICE_STORED, BOTH, BOTH_STORED, HOST_ONLY, HOST_STORED,
          STORAGE_ONLY, FULL_KEPT, TOMBSTONE, ROOT, FOLDED)
#: The states with a copy in L3 storage (the storage colour family).
STORED_STATES = (DEVICE_STORED, BOTH_STORED, HOST_STORED, STORAGE_ONLY)

COLORS: dict[str, str] = {
    DEVICE: "#2a9d8f",
    BOTH: "#3d6fb6",
    HOST_ONLY: "#e9b949",
    STORAGE_ONLY: "#8c564b",   # the storage colour
    DEVICE_STORED: "#5e8c61",  # device teal mixed with storage brown
    BOTH_STORED: "#5a5f8c",    # device+host blue mixed with storage brown
    HOST_STORED: "#c08a4a",    # host amber mixed with storage brown
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
    DEVICE_STORED: "data on the device tier, also in L3 storage",
    BOTH_STORED: "data on the device tier with a host copy, also in L3 storage",
    HOST_STORED: "evicted from the device; a host copy remains, also in L3 storage",
    STORAGE_ONLY: "only in L3 storage (a prefetch can bring it back to host)",
    FULL_KEPT: ("an SWA window / MAMBA state tombstone: this component's data was dropped (its "
                "own pressure, or outside the window) while the node's FULL KV stays on device; "
                "it still serves the FULL prefix, and an insert heals it"),
    TOMBSTONE: "no data for this component on any tier",
    LOCKED: "pinned by a lock (device) or a host reference: not evictable",
    IN_FLIGHT: "a backup / load-back copy touching it is not acked yet",
    ROOT: "the tree root (no tokens)",
    FOLDED: "small sibling subtrees folded together to keep the drawing light",
}

_BASE = {STATE_DEVICE: DEVICE, STATE_BOTH: BOTH, STATE_HOST: HOST_ONLY,
         STATE_TOMBSTONE: TOMBSTONE, _L3: STORAGE_ONLY, DEVICE_STORED: DEVICE_STORED,
         BOTH_STORED: BOTH_STORED, HOST_STORED: HOST_STORED}


def stored_state(state: str, stored: bool) -> str:
    """The display state with (``stored``) or without an L3 copy (the others unchanged)."""
    if not stored:
        return state
    return {DEVICE: DEVICE_STORED, BOTH: BOTH_STORED, HOST_ONLY: HOST_STORED,
            TOMBSTONE: STORAGE_ONLY, FULL_KEPT: STORAGE_ONLY}.get(state, state)


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
        if s in STORED_STATES:  # the storage colour family: a storage-coloured rim
            border = COLORS[STORAGE_ONLY]
        chips.append(
            f'<span title="{MEANING[s]}" style="display:inline-block;margin:0 10px 4px 0;'
            f'white-space:nowrap"><span style="display:inline-block;width:12px;height:12px;'
            f'border-radius:3px;background:{color_of(s)};border:1px solid {border};'
            f'vertical-align:-1px;margin-right:5px"></span>{s}</span>')
    return "".join(chips)
