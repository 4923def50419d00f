"""The ``Sink`` protocol and the sink registry: how every output joins the one event stream.

Every output of the stream is a ``Sink``, built by name from ``REGISTRY``: the built-in ones
(``BUILTIN``: spans, metrics, the store; configured by ``telemetry.setup``'s own arguments) and
any other chosen per run with ``telemetry.setup(sinks={name: options})``. The fan-out
(``telemetry/sinks/fanout.py``) keeps the journal replica every sink may read and calls the
sinks in order, each call guarded. A new output is one module plus one line in ``REGISTRY``:
the writer process (a separate interpreter) builds it from the name and the options, so both
must be plain data (picklable).

    class MySink:                      # in telemetry/sinks/my_sink.py
        def __init__(self, health, **options): ...
        def attach(self, info, snapshot, replica): ...
        def ops(self, ops, mutations): ...
        def event(self, ts_ns, seq, kind, attrs): ...
        def flush(self): ...
        def close(self): ...

    REGISTRY["my_sink"] = "radixscope.telemetry.sinks.my_sink:MySink"

Optional methods, called only on sinks that define them: ``bind(fanout)`` once all sinks are
built (read ``fanout.stats()`` or another sink by ``fanout.named[name]``: the store reads the
span sink's ids); ``spans(rows)`` (host-process span rows) and ``violation(ts_ns, seq, kind,
message, details)``; ``commit()`` after each batch of messages; ``end(clean)`` before the final
flush (``clean`` False: the host process went away without closing telemetry); ``cuts(ops)``,
called before an op batch: ascending indices of ops after which the sink must see the replica
(the store's pool samples), and every sink then gets that batch as sub-batches ending there,
each with its own mutations, the replica having applied just those. A sink whose
class sets ``records_close = True`` (the store) is flushed and closed after every other sink
has closed, so what fails while the exporters shut down is in the stats it keeps.

Every call is guarded by the fan-out: an exception is logged and counted under
``sink.<Class>.<method>``, never raised into the drain thread or the cache.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from radixscope.cache.snapshot import CacheSnapshot
    from radixscope.telemetry.record.drops import Health
    from radixscope.telemetry.record.encode import CompactOp
    from radixscope.telemetry.store.journal import Journal


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
    "spans": "radixscope.telemetry.sinks.spans_sink:SpansSink",  # one OTel span per op
    "metrics": "radixscope.telemetry.sinks.metrics_sink:MetricsSink",  # OTel instruments
    "store": "radixscope.telemetry.sinks.store_sink:StoreSink",  # the SQLite store
    "kv_events": "radixscope.telemetry.kvevents.publisher:KvEventPublisher",  # vLLM-format KV events
}
# configured by setup's own arguments (spans=, metrics=, store=...), not by setup(sinks=)
BUILTIN = ("spans", "metrics", "store")


def targets(specs: Sequence[tuple[str, dict]]) -> dict[str, str]:
    """``name -> "module:Class"`` of the sinks in ``specs`` as registered now: the writer
    process builds from these, so a sink registered at run time reaches it too."""
    return {name: REGISTRY[name] for name, _ in specs if name in REGISTRY}


def resolve(name: str, registry: Mapping[str, str] | None = None) -> type:
    """The class registered as ``name`` (in ``registry``, default ``REGISTRY``).

    Raises:
        ValueError: ``name`` is not registered (naming the registered ones).
    """
    target = (registry if registry is not None else REGISTRY).get(name)
    if target is None:
        raise ValueError(f"sink {name!r} is not registered (registered: {sorted(REGISTRY)})")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def check(sinks: Mapping[str, Mapping[str, Any]] | None) -> tuple[tuple[str, dict], ...]:
    """Validate ``setup(sinks=...)`` before anything starts: ``((name, options), ...)``.

    Raises:
        ValueError: an unregistered or built-in name, or options that are not a mapping.
    """
    out = []
    for name, options in (sinks or {}).items():
        if name in BUILTIN:
            raise ValueError(f"sinks: {name!r} is built in; setup's own arguments configure it")
        if name not in REGISTRY:
            raise ValueError(f"sinks: {name!r} is not registered "
                             f"(registered: {sorted(REGISTRY)})")
        if not isinstance(options, Mapping):
            raise ValueError(f"sinks[{name!r}]={options!r}: must be a mapping of options")
        out.append((name, dict(options)))
    return tuple(out)


def build(specs: Sequence[tuple[str, dict]], health: Health,
          registry: Mapping[str, str] | None = None) -> dict[str, Sink]:
    """Instantiate the sinks named in ``specs``, in order (each ``cls(health, **options)``),
    from ``registry`` (default ``REGISTRY``; the writer process: the host's ``targets``).

    Raises:
        ValueError: a name given twice or not registered.
    """
    out: dict[str, Sink] = {}
    for name, options in specs:
        if name in out:
            raise ValueError(f"sink {name!r} given twice")
        out[name] = resolve(name, registry)(health, **options)
    return out
