"""The writer process: builds spans and metrics and writes the store, beside the cache's process.

``main_from_fds`` is the entry point of the writer interpreter (``ProcessTransport`` starts it).
It builds the sinks from a picklable ``WriterSpec`` (the first message): span ids for every op,
span objects and metric instruments only for configured exporters / readers, and the store;
then loops: receive pickled message batches, coalesce what is already
waiting, hand them to the ``Fanout``, commit. ``("flush", token)`` and ``("close", token)`` are
answered on the acknowledgement pipe with the merged stats. End-of-file on the pipe (the host
process died) closes the store, so a crash still leaves a readable store, and records that the
run did not close telemetry (``info["closed"]["clean"]`` false).
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import resource
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider

from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.sinks import base as sinkbase
from radixscope.telemetry.sinks import otel_exporters as backends
from radixscope.telemetry.sinks.fanout import Fanout
from radixscope.telemetry.sinks.spans import DirectSpans
from radixscope.telemetry.store.writer import StoreWriter

log = logging.getLogger("radixscope.telemetry")

_COALESCE_MAX = 256  # message batches handled per commit at most
_COALESCE_S = 0.025  # after a batch arrives, wait this long for more before committing


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
        nice: niceness increment of the writer process, so that on a busy machine the cache's
            process gets the CPU first (the writer catches up when it idles).
        sinks: registered sinks to build, ``((name, options), ...)`` (``telemetry/sinks/base.py``).
    """

    store: str | None
    backends: backends.BackendSpec = field(default_factory=backends.BackendSpec)
    spans: bool = True
    metrics: bool = True
    keyframe_every: int = 20000
    sample_every_ms: float = 100.0
    nice: int = 10
    sinks: tuple[tuple[str, dict], ...] = ()


def build_sink(spec: WriterSpec, health: Health) -> tuple[Fanout, list[Any]]:
    """The writer's sink and the providers / processors it owns (to shut down at the end).

    Spans: ids are assigned directly (``DirectSpans``); SDK span objects are only made when an
    exporter is configured. Metrics: instruments only when a metric reader is configured (the
    store's pool samples come from the journal either way).

    Args:
        spec: the writer spec.
        health: the writer's counters.

    Returns:
        ``(sink, [things with shutdown()])``.
    """
    b = spec.backends
    owned: list[Any] = []
    spans = procs = None
    if spec.spans:
        exporters = backends.span_exporters(b)
        procs = backends.batch_processors(exporters, b, health)
        owned.extend(procs)
        spans = DirectSpans(backends.resource(b), export=bool(procs))
    mp_ = None
    if spec.metrics:
        readers = backends.metric_readers(b, health)
        if readers:
            mp_ = MeterProvider(metric_readers=readers, resource=backends.resource(b))
            owned.append(mp_)
    store = StoreWriter(spec.store) if spec.store else None

    def flush_exports() -> None:
        for p in procs or ():
            p.force_flush()
        if mp_ is not None:
            mp_.force_flush()

    sink = Fanout(health, store, spans, mp_, span_processors=procs or (),
                  keyframe_every=spec.keyframe_every, sample_every_ms=spec.sample_every_ms,
                  flush_hook=flush_exports,
                  resource=dict(backends.resource(b).attributes),
                  extra=sinkbase.build(spec.sinks, health))
    return sink, owned


_GC_THRESHOLD = (100_000, 50, 1000)


def main_from_fds(data_fd: int, ack_fd: int) -> None:
    """Entry point of the writer interpreter: the first message on the data pipe is the spec.

    The writer is its own interpreter, so it tunes its own garbage collector: it holds a
    replica of the whole tree (long-lived lists) and decodes thousands of short-lived tuples
    per batch, which with the default thresholds made the collector re-scan the replica over
    and over (about a third of the writer's CPU; on a machine whose vCPUs share a core, CPU the
    cache's thread loses too). Collections stay on, just far less frequent."""
    gc.set_threshold(*_GC_THRESHOLD)
    conn = Connection(data_fd, writable=False)
    acks = Connection(ack_fd, readable=False)
    try:
        first = pickle.loads(conn.recv_bytes())
    except EOFError:
        return
    writer_main(conn, acks, first[0][1])


def writer_main(conn: Connection, acks: Connection, spec: WriterSpec) -> None:
    """Serve one host until ``close`` or end-of-file on ``conn``."""
    health = Health()
    try:
        if spec.nice and hasattr(os, "nice"):
            os.nice(spec.nice)
        sink, owned = build_sink(spec, health)
    except Exception as e:  # noqa: BLE001 - report the failure to the host, then exit
        log.exception("telemetry writer could not start")
        acks.send_bytes(pickle.dumps(("failed", 0, f"{type(e).__name__}: {e}")))
        return
    try:
        _serve(conn, acks, sink)
    finally:
        with health.guard("writer.shutdown"):
            sink.close(clean=False)  # a no-op after a "close" request: already closed cleanly
            for thing in owned:
                thing.shutdown()


def _serve(conn: Connection, acks: Connection, sink: Fanout) -> None:
    while True:
        try:
            batches = [pickle.loads(conn.recv_bytes())]
            # one transaction per ~25 ms of records rather than per drain batch (every 5 ms):
            # fewer commits and WAL frames; a flush or close request ends the wait at once
            deadline = time.monotonic() + _COALESCE_S
            while len(batches) < _COALESCE_MAX and _is_data(batches[-1]):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not conn.poll(remaining):
                    break
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
                acks.send_bytes(pickle.dumps(("flushed", token, _with_usage(sink.flush()))))
            elif kind == "close":
                stats = _with_usage(sink.close())
                acks.send_bytes(pickle.dumps(("closed", token, stats)))
                return
        if msgs:
            sink.handle(msgs)


def _with_usage(stats: dict) -> dict:
    """Add the writer's own CPU seconds (``stats["process"]["cpu_s"]``) for benchmarks."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {**stats, "process": {"cpu_s": ru.ru_utime + ru.ru_stime}}


def _is_data(batch: list[tuple]) -> bool:
    return not (len(batch) == 1 and batch[0][0] in ("flush", "close"))
