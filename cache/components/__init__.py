"""Component registry: one table from name to implementation."""

from __future__ import annotations

from radixscope.cache.components.base import Component
from radixscope.cache.components.full import FullComponent
from radixscope.cache.components.mamba import MambaComponent
from radixscope.cache.components.swa import SwaComponent

REGISTRY: dict[str, type[Component]] = {
    "full": FullComponent,
    "swa": SwaComponent,
    "mamba": MambaComponent,
}


def _the(flag: str) -> str:
    (name,) = [n for n, c in REGISTRY.items() if getattr(c, flag)]
    return name


# the roles code outside this package asks for by name (never by spelling the name out)
BACKBONE: str = _the("is_backbone")    # every node's data implies this one's (FULL)
WINDOW: str = _the("has_window")       # the sliding-window component (SWA)
STATE: str = _the("boundary_state")    # the recurrent state at a node's end (MAMBA)
NAMES: tuple[str, ...] = tuple(REGISTRY)  # every component, backbone first
KV_SPEC_KINDS: dict[str, str] = {n: c.kv_spec_kind for n, c in REGISTRY.items() if c.kv_spec_kind}


def backbone_name() -> str:
    """The backbone component's name (the default of every per-component cache call)."""
    return BACKBONE


def rules(name: str) -> type[Component]:
    """The class whose rules a component named in a snapshot or store follows (a name this
    build does not know, e.g. from another engine's KV events, follows the base rules)."""
    return REGISTRY.get(name, Component)


def build_components(config) -> list[Component]:
    return [REGISTRY[name](i, config) for i, name in enumerate(config.components)]


__all__ = ["BACKBONE", "Component", "KV_SPEC_KINDS", "NAMES", "REGISTRY", "STATE", "WINDOW",
           "backbone_name", "build_components", "rules"]
