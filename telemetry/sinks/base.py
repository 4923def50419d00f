"""The ``Sink`` protocol and the sink registry: how a new output joins the one event stream.

The fan-out (``telemetry/sinks/fanout.py``) always keeps the journal replica, the spans, the metrics and
the store; any other output is a ``Sink`` registered here by name and chosen per run with
``telemetry.setup(sinks={name: options})``. A new output is one module plus one line in
``REGISTRY``: the writer process (a separate interpreter) builds it from the name and the
options, so both must be plain data (picklable).

    class MySink:                      # in telemetry/sinks/my_sink.py
        def __init__(self, health, **options): ...
        def attach(self, info, snapshot, replica): ...
        def ops(self, ops, mutations): ...
        def event(self, ts_ns, seq, kind, attrs): ...
        def flush(self): ...
        def close(self): ...

    REGISTRY["my_sink"] = "radixscope.telemetry.sinks.my_sink:MySink"

Every call is guarded by the fan-out: an exception is logged and counted, never raised into the
drain thread or the cache.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from radixscope.cache.snapshot import CacheSnapshot
    from radixscope.telemetry.record.drops import Health
    from radixscope.telemetry.record.encode import CompactOp
    from radixscope.telemetry.sinks.journal import Journal


class Sink(Protocol):
    """One output of the event stream (built in the writer process, or on the drain thread)."""

    def attach(self, info: dict, snapshot: CacheSnapshot, replica: Journal | None) -> None:
        """The cache attached: its config ``info`` and its state at ``snapshot.seq``.
        ``replica`` is the fan-out's journal replica (read it, never change it): when ``ops``
        is called it has applied that batch's mutations, so a sink that needs the tree as it
        is now (the KV-event publisher) reads it there rather than keeping a second copy."""

    def ops(self, ops: Sequence[CompactOp], mutations: Sequence[tuple]) -> None:
        """A batch of op records and the mutations accepted with them (in seq order)."""

    def event(self, ts_ns: int, seq: int | None, kind: str, attrs: dict) -> None:
        """An engine or cache event (admission, request lifecycle...)."""

    def flush(self) -> None:
        """Push out whatever is buffered."""

    def close(self) -> None:
        """Final flush and release; called once."""


# name -> "module:Class"; imported only when a run asks for the sink by name
REGISTRY: dict[str, str] = {
    "kv_events": "radixscope.telemetry.kvevents.publisher:KvEventPublisher",  # vLLM-format KV events
}


def resolve(name: str) -> type:
    """The class registered as ``name``.

    Raises:
        ValueError: ``name`` is not registered (naming the registered ones).
    """
    target = REGISTRY.get(name)
    if target is None:
        raise ValueError(f"sink {name!r} is not registered (registered: {sorted(REGISTRY)})")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def check(sinks: Mapping[str, Mapping[str, Any]] | None) -> tuple[tuple[str, dict], ...]:
    """Validate ``setup(sinks=...)`` before anything starts: ``((name, options), ...)``.

    Raises:
        ValueError: an unregistered name or options that are not a mapping.
    """
    out = []
    for name, options in (sinks or {}).items():
        if name not in REGISTRY:
            raise ValueError(f"sinks: {name!r} is not registered "
                             f"(registered: {sorted(REGISTRY)})")
        if not isinstance(options, Mapping):
            raise ValueError(f"sinks[{name!r}]={options!r}: must be a mapping of options")
        out.append((name, dict(options)))
    return tuple(out)


def build(specs: Sequence[tuple[str, dict]], health: Health) -> list[Sink]:
    """Instantiate the registered sinks named in ``specs`` (each ``cls(health, **options)``)."""
    return [resolve(name)(health, **options) for name, options in specs]
