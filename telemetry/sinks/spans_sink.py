"""The span sink: one OpenTelemetry span per op, and each op's span ids for the store.

Built from the registry as ``spans`` (``telemetry/sinks/base.py``), in one of two ways:

- ``SpansSink(health, tracer_provider=tp)`` (inline mode): ``TracerSpans`` through that provider,
  whose sampler and processors see the spans; ``flush`` force-flushes it (the handle owns it).
- ``SpansSink(health, backends=spec)`` (the writer process): ``DirectSpans`` assigns the ids;
  span objects are made only for the exporters ``spec`` asks for, through batch processors
  this sink owns (flushed on ``flush``, shut down on ``close``).

``ids`` holds the ``(trace_id, span_id, parent_span_id)`` of the last batch's ops, in order:
the store sink reads it (``bind``) so each op row carries its span's ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.record.encode import CompactOp
from radixscope.telemetry.sinks import otel_exporters as otel
from radixscope.telemetry.sinks.spans import NO_IDS, DirectSpans, Ids, TracerSpans

if TYPE_CHECKING:
    from radixscope.cache.snapshot import CacheSnapshot
    from radixscope.telemetry.store.journal import Journal


class SpansSink:
    """Spans of the cache's ops (see the module docstring).

    Args:
        health: the fan-out's counters.
        tracer_provider: inline mode: build spans on this provider.
        backends: writer process: the exporters besides the store (a ``BackendSpec``).
    """

    def __init__(self, health: Health, tracer_provider: trace.TracerProvider | None = None,
                 backends: otel.BackendSpec | None = None) -> None:
        self.health = health
        self.ids: list[Ids] = []
        self._provider = tracer_provider
        self._procs: list[Any] = []
        if tracer_provider is not None:
            self.builder: TracerSpans | DirectSpans = TracerSpans(tracer_provider)
        else:
            spec = backends if backends is not None else otel.BackendSpec()
            self._procs = otel.batch_processors(otel.span_exporters(spec), spec, health)
            self.builder = DirectSpans(otel.resource(spec), export=bool(self._procs))

    def attach(self, info: dict, snapshot: CacheSnapshot, replica: Journal | None) -> None:
        pass

    def ops(self, ops: Sequence[CompactOp], mutations: Sequence[tuple]) -> None:
        build = self.builder.build
        ids: list[Ids] = []
        for op in ops:
            try:
                ids.append(build(op))
            except Exception as e:  # noqa: BLE001 - guard point: log + count, keep the op row
                self.health.fail("span_build", e, f"op {op.op_id} ({op.op})")
                ids.append(NO_IDS)
        self.ids = ids
        builder = self.builder
        if isinstance(builder, DirectSpans) and builder.pending:
            for span in builder.take():
                for proc in self._procs:
                    with self.health.guard("span_export"):
                        proc.on_end(span)

    def event(self, ts_ns: int, seq: int | None, kind: str, attrs: dict) -> None:
        pass

    def flush(self) -> None:
        for p in self._procs:
            p.force_flush()
        if self._provider is not None and hasattr(self._provider, "force_flush"):
            self._provider.force_flush()

    def close(self) -> None:
        for p in self._procs:
            with self.health.guard("span_export"):
                p.shutdown()

