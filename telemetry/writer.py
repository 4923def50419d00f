"""The writer process: builds spans and metrics and writes the store, beside the cache's process.

``writer_main`` is the process target. It builds its own tracer provider (store span processor
plus any OTLP / console exporters) and meter provider (OTLP / Prometheus readers) from a
picklable ``WriterSpec``, then loops: receive pickled message batches, coalesce what is already
waiting, hand them to a ``Sink``, commit. ``("flush", token)`` and ``("close", token)`` are
answered on the acknowledgement pipe with the merged stats. End-of-file on the pipe (the host
process died) closes the store cleanly, so a crash still leaves a readable store.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from telemetry import backends
from telemetry.exporters import StoreSpanProcessor
from telemetry.health import Health
from telemetry.sink import Sink
from telemetry.store_writer import StoreWriter

log = logging.getLogger("radixscope.telemetry")

_COALESCE_MAX = 64  # message batches handled per commit when the writer is behind


@dataclass(frozen=True)
class WriterSpec:
    """Everything the writer process needs (plain data, picklable).

    Attributes:
        store: path of an existing store, or None (spans/metrics only).
        backends: exporters besides the store.
        spans: build a span per op.
        metrics: keep the OTel instruments.
        keyframe_every: mutations between keyframes.
        sample_every_ms: cache time between metric samples in the store.
    """

    store: str | None
    backends: backends.BackendSpec = field(default_factory=backends.BackendSpec)
    spans: bool = True
    metrics: bool = True
    keyframe_every: int = 5000
    sample_every_ms: float = 100.0


def build_sink(spec: WriterSpec, health: Health) -> tuple[Sink, TracerProvider | None,
                                                          MeterProvider | None]:
    """The writer's sink and the providers it owns.

    Args:
        spec: the writer spec.
        health: the writer's counters.

    Returns:
        ``(sink, tracer_provider or None, meter_provider or None)``.
    """
    tp = backends.build_tracer_provider(spec.backends) if spec.spans else None
    mp_ = backends.build_meter_provider(spec.backends) if spec.metrics else None
    store = StoreWriter(spec.store) if spec.store else None

    def flush_providers() -> None:
        if tp is not None:
            tp.force_flush()
        if mp_ is not None and mp_._sdk_config.metric_readers:
            mp_.force_flush()

    sink = Sink(health, store, tp, mp_, keyframe_every=spec.keyframe_every,
                sample_every_ms=spec.sample_every_ms, flush_hook=flush_providers)
    if tp is not None:
        if store is not None:
            tp.add_span_processor(StoreSpanProcessor(sink.put_span, health))
        backends.add_exporters(tp, backends.span_exporters(spec.backends), spec.backends, health)
    return sink, tp, mp_


def writer_main(conn: Connection, acks: Connection, spec: WriterSpec) -> None:
    """Process target: serve one host until ``close`` or end-of-file."""
    health = Health()
    try:
        sink, tp, mp_ = build_sink(spec, health)
    except Exception as e:  # noqa: BLE001 - report the failure to the host, then exit
        log.exception("telemetry writer could not start")
        acks.send_bytes(pickle.dumps(("failed", 0, f"{type(e).__name__}: {e}")))
        return
    try:
        _serve(conn, acks, sink)
    finally:
        with health.guard("writer.shutdown"):
            sink.close()
            if tp is not None:
                tp.shutdown()
            if mp_ is not None:
                mp_.shutdown()


def _serve(conn: Connection, acks: Connection, sink: Sink) -> None:
    while True:
        try:
            batches = [pickle.loads(conn.recv_bytes())]
            while len(batches) < _COALESCE_MAX and _is_data(batches[-1]) and conn.poll(0):
                batches.append(pickle.loads(conn.recv_bytes()))
        except EOFError:
            return
        msgs: list[tuple] = []
        for batch in batches:
            if _is_data(batch):
                msgs.extend(batch)
                continue
            if msgs:
                sink.handle(msgs)
                msgs = []
            kind, token = batch[0]
            if kind == "flush":
                acks.send_bytes(pickle.dumps(("flushed", token, sink.flush())))
            elif kind == "close":
                stats = sink.close()
                acks.send_bytes(pickle.dumps(("closed", token, stats)))
                return
        if msgs:
            sink.handle(msgs)


def _is_data(batch: list[tuple]) -> bool:
    return not (len(batch) == 1 and batch[0][0] in ("flush", "close"))
