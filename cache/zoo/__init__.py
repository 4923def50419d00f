"""The bug zoo: fault points that re-introduce, on one cache instance, each crash class the
field keeps shipping (DESIGN.md, "Known bug classes"; issue 18).

An injection replaces (or wraps) a method or attribute on **one** cache instance with the
historically buggy variant; nothing in the production code paths checks for faults, so they
cost nothing. Nothing reaches this module from a ``CacheConfig``, a preset or an environment
variable: only tests and ``radixscope run --inject NAME`` (``engine.run.execute(inject=...)``)
call ``inject``.

Each injection records where it *fired*: the op id (``cache.current_op_id``) at which the
buggy variant first made a decision the correct code would not have made, with the nodes it
touched. A detector (``check()`` after each op, the admission guarantee, transfer validation,
content verification, the engine's end-of-request lock guard) stops the run; the distance
between the two op ids is "operations to detection".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Fault:
    """One crash class.

    Attributes:
        name: what ``--inject`` takes.
        number: the class number of issue 18.
        title: the bug in one line.
        shipped: where it shipped (seed / SGLang PR or issue).
        mechanism: what the injected variant does, as the buggy code did.
        caught_by: the radixscope defence that catches it.
        install: ``install(cache, injection)`` puts the buggy variant on the instance.
        targets: what it can be installed on (``"cache"``, ``"prefetch"``).
        needs_storage: an engine run needs ``--storage`` and a SWA or MAMBA component.
    """

    name: str
    number: int
    title: str
    shipped: str
    mechanism: str
    caught_by: str
    install: Callable[[Any, Injection], None]
    # what ``inject`` takes it on: ``"cache"`` (a ``HiRadixCache``: ``--inject``) and / or
    # ``"prefetch"`` (a bare ``PrefetchController``)
    targets: tuple[str, ...] = ("cache",)
    needs_storage: bool = False  # an engine run needs an L3 tier (``--storage``) with pools


@dataclass
class Firing:
    """The buggy variant diverged from the correct code during op ``op_id``."""

    op_id: int
    seq: int
    nodes: tuple[int, ...]
    what: str


@dataclass
class Injection:
    """An installed fault on one cache instance.

    Attributes:
        fault: the class.
        cache: the ``HiRadixCache`` (or controller) it was installed on.
        fired: every divergence, oldest first.
    """

    fault: Fault
    cache: Any
    fired: list[Firing] = field(default_factory=list)

    def fire(self, what: str, nodes=(), op_id: int | None = None) -> None:
        """Record that the buggy variant just did what the correct code would not have.

        ``op_id`` defaults to the op the decision belongs to: the op running now, or, when
        none runs (a wrapper deciding before it calls the operation, a transfer ack about to be
        recorded), the next op the cache will record."""
        if op_id is None:
            cur = int(getattr(self.cache, "current_op_id", 0))
            op_id = cur if getattr(self.cache, "_depth", 0) else cur + 1
        self.fired.append(Firing(op_id, int(getattr(self.cache, "seq", 0)),
                                 tuple(int(n) for n in nodes), what))

    def last_fired_before(self, op_id: int) -> Firing | None:
        """The latest firing at or before ``op_id`` (None if the fault never fired by then)."""
        got = [f for f in self.fired if f.op_id <= op_id]
        return got[-1] if got else None

    def describe(self) -> dict:
        """Plain data for a store event / a bundle note."""
        f = self.fault
        return {"name": f.name, "class": f.number, "title": f.title, "shipped": f.shipped,
                "mechanism": f.mechanism, "caught_by": f.caught_by,
                "fired": [{"op_id": x.op_id, "seq": x.seq, "nodes": list(x.nodes),
                           "what": x.what} for x in self.fired]}


class UnknownFault(ValueError):
    """``inject`` was given a name the zoo does not have."""


def _registry() -> dict[str, Fault]:
    from radixscope.cache.zoo import prefetch_faults, transfer_faults, tree_faults

    out: dict[str, Fault] = {}
    for f in (*tree_faults.FAULTS, *transfer_faults.FAULTS, *prefetch_faults.FAULTS):
        out[f.name] = f
    return dict(sorted(out.items(), key=lambda kv: kv[1].number))


def faults(target: str | None = None) -> dict[str, Fault]:
    """Every fault by name, in class order (only those for ``target``, when given)."""
    return {k: f for k, f in _registry().items() if target is None or target in f.targets}


def names(target: str = "cache") -> tuple[str, ...]:
    """The faults ``inject`` can put on a ``target`` (``"cache"``: what ``--inject`` takes)."""
    return tuple(faults(target))


def inject(obj: Any, name: str, target: str = "cache") -> Injection:
    """Install fault ``name`` on ``obj`` (a ``HiRadixCache`` for ``target="cache"``, a
    ``PrefetchController`` for ``"prefetch"``). Returns the ``Injection``.

    Raises:
        UnknownFault: ``name`` is not a ``target`` fault (the message lists the known names).
    """
    reg = faults(target)
    fault = reg.get(name) if isinstance(name, str) else None
    if fault is None:
        raise UnknownFault(f"unknown fault {name!r}; the zoo has: {', '.join(reg)}")
    cache = obj
    inj = Injection(fault, cache)
    fault.install(cache, inj)
    return inj


__all__ = ["Fault", "Firing", "Injection", "UnknownFault", "faults", "inject", "names"]
