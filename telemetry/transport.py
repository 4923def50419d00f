"""Transports from the drain thread to the sinks.

- ``InlineTransport``: the sinks run on the drain thread of this process (tests, in-memory
  exporters, notebooks). Simple, but span building and SQLite writes then share the GIL with
  the cache.
- ``ProcessTransport``: the sinks run in a separate writer process (``telemetry/writer.py``,
  started with ``spawn`` by default so it is safe under threads and CUDA). Message batches are
  pickled onto a pipe; when the pipe is full the drain thread waits, the recorder's queue grows
  and its overflow policy applies: backpressure never reaches the cache except through that
  policy. ``flush`` and ``close`` wait for the writer's acknowledgement.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time

from telemetry.health import Health
from telemetry.sink import Sink
from telemetry.writer import WriterSpec, writer_main


class InlineTransport:
    """Hands messages straight to a ``Sink`` in this process."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def send(self, messages: list[tuple]) -> None:
        self.sink.handle(messages)

    def flush(self, timeout_s: float) -> dict:
        return self.sink.flush()

    def close(self, timeout_s: float) -> dict:
        return self.sink.close()


class WriterGone(RuntimeError):
    """The writer process exited; nothing more can be delivered."""


class ProcessTransport:
    """Ships pickled message batches to a writer process.

    Args:
        spec: what the writer builds (store path, exporters, keyframe cadence...).
        health: host-side counters.
        start_method: multiprocessing start method (``spawn``, ``forkserver`` or ``fork``).
        start_timeout_s: longest wait for the writer to report ready, in ``flush``/``close``.
    """

    def __init__(self, spec: WriterSpec, health: Health, start_method: str = "spawn",
                 start_timeout_s: float = 60.0) -> None:
        ctx = mp.get_context(start_method)
        self.health = health
        self.start_timeout_s = start_timeout_s
        recv_end, self._out = ctx.Pipe(duplex=False)
        self._acks, ack_send = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=writer_main, args=(recv_end, ack_send, spec),
                                   name="radixscope-telemetry-writer", daemon=True)
        self.process.start()
        recv_end.close()
        ack_send.close()
        self._token = 0
        self._dead = False
        self.writer_error: str | None = None

    def send(self, messages: list[tuple]) -> None:
        if self._dead:
            raise WriterGone(f"telemetry writer process is gone ({self.writer_error})")
        data = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._out.send_bytes(data)
        except OSError as e:
            self._dead = True
            self.writer_error = f"pipe closed: {e}"
            raise WriterGone(f"telemetry writer process is gone ({e})") from None

    def _request(self, kind: str, timeout_s: float) -> dict:
        self._token += 1
        token = self._token
        self.send([(kind, token)])
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._acks.poll(remaining):
                self.health.fail(f"transport.{kind}", None,
                                 f"no acknowledgement from the writer within {timeout_s:.1f}s")
                return {}
            try:
                reply = pickle.loads(self._acks.recv_bytes())
            except EOFError:
                self._dead = True
                self.writer_error = f"writer exited (exit code {self.process.exitcode})"
                raise WriterGone(self.writer_error) from None
            if reply[0] == "failed":
                self._dead = True
                self.writer_error = reply[2]
                raise WriterGone(f"telemetry writer failed: {reply[2]}")
            if reply[1] == token:
                return reply[2]

    def flush(self, timeout_s: float) -> dict:
        return self._request("flush", max(timeout_s, self.start_timeout_s))

    def close(self, timeout_s: float) -> dict:
        stats: dict = {}
        try:
            if not self._dead:
                stats = self._request("close", max(timeout_s, self.start_timeout_s))
        finally:
            self._out.close()
            self.process.join(timeout=max(1.0, timeout_s))
            if self.process.is_alive():
                self.health.fail("transport.close", None, "writer did not exit; terminating")
                self.process.terminate()
                self.process.join(timeout=5.0)
            self._acks.close()
        return stats
