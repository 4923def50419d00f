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


def rules(name: str) -> type[Component]:
    """The class whose rules a component named in a snapshot or store follows (a name this
    build does not know, e.g. from another engine's KV events, follows the base rules)."""
    return REGISTRY.get(name, Component)


def build_components(config) -> list[Component]:
    return [REGISTRY[name](i, config) for i, name in enumerate(config.components)]


__all__ = ["Component", "REGISTRY", "build_components", "rules"]
