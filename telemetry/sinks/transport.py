"""Transports from the drain thread to the sinks.

- ``InlineTransport``: the sinks run on the drain thread of this process (tests, in-memory
  exporters, notebooks). Simple, but span building and SQLite writes then share the GIL with
  the cache.
- ``ProcessTransport``: the sinks run in a separate writer process (``telemetry/sinks/writer_process.py``,
  a fresh interpreter, so it is safe under threads and CUDA). Message batches are pickled onto
  a pipe, their record blobs out of band (``writer_process.send_message``); when the pipe is
  full the drain thread waits, the recorder's queue grows and its overflow policy applies:
  backpressure never reaches the cache except through that policy. ``flush`` and ``close``
  wait for the writer's acknowledgement.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from radixscope.telemetry.record.drops import Health
from radixscope.telemetry.sinks.fanout import Fanout
from radixscope.telemetry.sinks.writer_process import WriterSpec, send_message

# the writer's module by its own name, so the child imports the same installed package
_BOOT = (f"import sys; from {WriterSpec.__module__} import main_from_fds; "
         "main_from_fds(int(sys.argv[1]), int(sys.argv[2]))")
_F_SETPIPE_SZ = 1031  # Linux: grow the pipe so a batch rarely blocks the drain thread


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass  # not Linux, or over /proc/sys/fs/pipe-max-size: the default size works too


class InlineTransport:
    """Hands messages straight to the ``Fanout`` in this process."""

    def __init__(self, sink: Fanout) -> None:
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
    """Ships pickled message batches to a writer process over OS pipes.

    The writer is a fresh interpreter started with ``subprocess`` (not ``multiprocessing``):
    nothing of this process is forked (safe under threads and CUDA) and, unlike ``spawn``, the
    caller's ``__main__`` module is not re-imported in the child, so scripts without an
    ``if __name__ == "__main__"`` guard work.

    Args:
        spec: what the writer builds (store path, exporters, keyframe cadence...).
        health: host-side counters.
        start_timeout_s: longest wait for the writer's first acknowledgement.
    """

    def __init__(self, spec: WriterSpec, health: Health, start_timeout_s: float = 60.0) -> None:
        self.health = health
        self.start_timeout_s = start_timeout_s
        data_r, data_w = os.pipe()
        ack_r, ack_w = os.pipe()
        _grow_pipe(data_w)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(data_r), str(ack_w)], pass_fds=(data_r, ack_w),
                stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(data_r)
            os.close(ack_w)
        self._out = Connection(data_w, readable=False)
        self._send_lock = threading.Lock()
        self._acks = Connection(ack_r, writable=False)
        self._token = 0
        self._dead = False
        self._niced: int | None = None  # the writer's niceness while prioritized
        self.writer_error: str | None = None
        self.send([("spec", spec)])

    def send(self, messages: list[tuple]) -> None:
        if self._dead:
            raise WriterGone(f"telemetry writer process is gone ({self.writer_error})")
        try:
            with self._send_lock:  # one message's frames back to back
                send_message(self._out, messages)
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
                self.writer_error = f"writer exited (exit code {self.process.poll()})"
                raise WriterGone(self.writer_error) from None
            if reply[0] == "failed":
                self._dead = True
                self.writer_error = reply[2]
                raise WriterGone(f"telemetry writer failed: {reply[2]}")
            if reply[1] == token:
                return reply[2]

    def prioritize(self) -> bool:
        """The host is about to wait for the writer (``flush``, ``close``): run the writer at
        the host's own priority meanwhile. It runs niced (``WriterSpec.nice``) so that the
        cache's process gets the CPU first; but once the host waits for it, a busy machine
        would starve it (at nice 10 against one busy process it gets about a tenth of a
        core: a backlog that takes 1 s drains in 10). Lowering a niceness needs the privilege
        to (root or CAP_SYS_NICE); without it nothing changes.

        Returns:
            Whether the writer's priority was raised (``deprioritize`` restores it).
        """
        try:
            host = os.getpriority(os.PRIO_PROCESS, 0)
            pid = self.process.pid
            writer = os.getpriority(os.PRIO_PROCESS, pid)
            if writer <= host:
                return False
            os.setpriority(os.PRIO_PROCESS, pid, host)
        except (OSError, AttributeError):  # unprivileged, no such call, or the writer is gone
            return False
        self._niced = writer
        return True

    def deprioritize(self) -> None:
        """The writer's niceness as it was before ``prioritize`` (after a ``flush``)."""
        niced, self._niced = self._niced, None
        if niced is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self.process.pid, niced)

    def flush(self, timeout_s: float) -> dict:
        return self._request("flush", max(timeout_s, self.start_timeout_s))

    def close(self, timeout_s: float) -> dict:
        stats: dict = {}
        try:
            if not self._dead:
                stats = self._request("close", max(timeout_s, self.start_timeout_s))
        finally:
            self._out.close()
            try:
                self.process.wait(timeout=max(1.0, timeout_s))
            except subprocess.TimeoutExpired:
                self.health.fail("transport.close", None, "writer did not exit; terminating")
                self.process.terminate()
                self.process.wait(timeout=5.0)
            self._acks.close()
        return stats
