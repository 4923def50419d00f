"""The writer process: builds spans and metrics and writes the store, beside the cache's process.

``main_from_fds`` is the entry point of the writer interpreter (``ProcessTransport`` starts it).
It builds the sinks from a picklable ``WriterSpec`` (the first message), by name from the
registry (``telemetry/sinks/base.py``): span ids for every op, span objects and metric
instruments only for configured exporters / readers, the store, any registered sink; then
loops: receive pickled message batches, coalesce what is already waiting, hand them to the
``Fanout``, which commits once. ``("flush", token)`` and ``("close", token)`` are
answered on the acknowledgement pipe with the merged stats. End-of-file on the pipe (the host
process died) closes the store, so a crash still leaves a readable store, and records that the
run did not close telemetry (``info["closed"]["clean"]`` false).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import resource
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.sinks import base as sinkbase
from radixscope.telemetry.sinks.fanout import Fanout

log = logging.getLogger("radixscope.telemetry")

_COALESCE_MAX = 256  # message batches handled per commit at most
_COALESCE_S = 0.025  # after a batch arrives, wait this long for more before committing


@dataclass(frozen=True)
class WriterSpec:
    """Everything the writer process needs (plain data, picklable).

    Attributes:
        sinks: the sinks to build, in call order, ``((name, options), ...)``: the built-in
            spans / metrics / store with their plain-data options and any registered one
            (``telemetry/sinks/base.py``).
        nice: niceness increment of the writer process, so that on a busy machine the cache's
            process gets the CPU first (the writer catches up when it idles).
        targets: ``name -> "module:Class"`` as the host's registry had them (``base.targets``);
            None: this interpreter's ``REGISTRY``.
    """

    sinks: tuple[tuple[str, dict], ...] = ()
    nice: int = 10
    targets: dict[str, str] | None = None


def build_sink(spec: WriterSpec, health: Health) -> Fanout:
    """The writer's fan-out over the sinks ``spec`` names (each owns what it builds: span
    processors, a meter provider, the store connection, and shuts it down on ``close``)."""
    return Fanout(health, sinkbase.build(spec.sinks, health, spec.targets))


_GC_THRESHOLD = (100_000, 50, 1000)


def send_message(conn: Connection, messages: list[tuple]) -> None:
    """One message batch onto the data pipe: its pickle, behind the number of buffers that
    follow it as frames of their own (4 bytes, little-endian), then those buffers: the
    ``("ops", blobs)`` batches, pickled out of band. A batch of ~3 MB is then copied once, by
    the kernel, with the GIL released, where pickling it in band copied it again in this
    process with the GIL held (1-2 ms, long enough to stall the cache's thread). The caller
    keeps one message's frames together (``ProcessTransport.send``'s lock)."""
    bufs: list[pickle.PickleBuffer] = []
    data = pickle.dumps([(m[0], [pickle.PickleBuffer(b) for b in m[1]]) if m[0] == "ops" else m
                         for m in messages], protocol=5, buffer_callback=bufs.append)
    conn.send_bytes(len(bufs).to_bytes(4, "little") + data)
    for b in bufs:
        conn.send_bytes(b)


def recv_message(conn: Connection) -> list[tuple]:
    """One message batch ``send_message`` sent (its blobs come back as ``bytes``)."""
    head = conn.recv_bytes()
    bufs = [conn.recv_bytes() for _ in range(int.from_bytes(head[:4], "little"))]
    with memoryview(head) as view:
        return pickle.loads(view[4:], buffers=bufs)


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
        first = recv_message(conn)
    except EOFError:
        return
    writer_main(conn, acks, first[0][1])
    _exit_now()


def _exit_now() -> None:
    """End the writer interpreter without tearing down its objects. ``writer_main`` has
    returned: the sinks are closed (store committed and its connection closed, exporters shut
    down) and the host has its acknowledgement, but the host waits for this process to exit,
    and a normal interpreter exit frees the journal replica node by node (0.6 s at 30 k nodes,
    about 2 s at 100 k: most of ``close()``). Only the standard streams and logging are
    flushed."""
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def writer_main(conn: Connection, acks: Connection, spec: WriterSpec) -> None:
    """Serve one host until ``close`` or end-of-file on ``conn``."""
    health = Health()
    try:
        if spec.nice and hasattr(os, "nice"):
            os.nice(spec.nice)
        sink = build_sink(spec, health)
    except Exception as e:  # noqa: BLE001 - report the failure to the host, then exit
        log.exception("telemetry writer could not start")
        acks.send_bytes(pickle.dumps(("failed", 0, f"{type(e).__name__}: {e}")))
        return
    try:
        _serve(conn, acks, sink)
    finally:
        with health.guard("writer.shutdown"):
            sink.close(clean=False)  # a no-op after a "close" request: already closed cleanly


def _serve(conn: Connection, acks: Connection, sink: Fanout) -> None:
    while True:
        try:
            batches = [recv_message(conn)]
            # one transaction per ~25 ms of records rather than per drain batch (every 5 ms):
            # fewer commits and WAL frames; a flush or close request ends the wait at once
            deadline = time.monotonic() + _COALESCE_S
            while len(batches) < _COALESCE_MAX and _is_data(batches[-1]):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not conn.poll(remaining):
                    break
                batches.append(recv_message(conn))
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
    """Add the writer's own counters for benchmarks (``stats["process"]``): ``cpu_s``, its
    garbage collector's collections by generation (``gc_collections``) and its minor page
    faults (``minor_faults``: memory it takes back from the kernel as fresh pages)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {**stats, "process": {"cpu_s": ru.ru_utime + ru.ru_stime,
                                 "gc_collections": [g["collections"] for g in gc.get_stats()],
                                 "minor_faults": ru.ru_minflt}}


def _is_data(batch: list[tuple]) -> bool:
    return not (len(batch) == 1 and batch[0][0] in ("flush", "close"))
