"""Automatic and on-demand crash bundles for a live cache.

``install_crash_bundles(cache, directory)`` sets ``cache.error_hook`` so that any public cache
operation that raises (an out-of-memory in ``alloc`` or ``load_back``, a double free, any bug)
writes a bundle into ``directory`` before the exception reaches the caller, and sets
``cache.bundle_writer`` (what ``HiRadixCache.dump_bundle(path)`` calls) for on-demand bundles.

``SignalTrigger`` turns a signal (``SIGUSR1`` by default) into an on-demand bundle. The handler
only sets a flag: the cache is not re-entrant and a signal can arrive in the middle of an
operation, so the engine calls ``trigger.service()`` between steps, on the cache's thread, and
the bundle is written there.

Nothing here raises into the cache: a failing bundle write is logged and counted.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from radixscope.telemetry.capture.bundle import write_bundle

log = logging.getLogger("radixscope.telemetry")
_NAME_RETRIES = 8


class CrashBundler:
    """The ``error_hook`` that writes bundles, and the on-demand writer.

    Attributes:
        directory: where bundles go.
        written: paths of the bundles written, oldest first.
        failures: bundle writes that failed (logged).
        skipped: failures not bundled because ``max_bundles`` was reached.
        bundled_errors: failures bundled so far (``max_bundles`` caps these; on-demand bundles
            are not capped).
    """

    def __init__(self, cache: Any, directory: Path, recorder: Any = None, telemetry: Any = None,
                 max_bundles: int = 8, n_ops: int | None = None,
                 cuda_memory: bool = False) -> None:
        self.cache = cache
        self.directory = directory
        self.recorder = recorder
        self.telemetry = telemetry
        self.max_bundles = max_bundles
        self.n_ops = n_ops
        self.cuda_memory = cuda_memory
        self.written: list[Path] = []
        self.failures = 0
        self.skipped = 0
        self.bundled_errors = 0
        self.previous_hook = None
        self._count = itertools.count(1)
        self._lock = threading.Lock()

    def __call__(self, op: str, exc: BaseException) -> None:
        """The cache's ``error_hook``: bundle the failure (up to ``max_bundles``), then hand it
        to the hook that was installed before, if any."""
        try:
            if self.bundled_errors >= self.max_bundles:
                self.skipped += 1
                log.warning("crash bundle limit (%d) reached; %s in %s not bundled",
                            self.max_bundles, type(exc).__name__, op)
            else:
                self.bundled_errors += 1
                self._write(self.path_for(op), exc, op, None)  # a fresh name: see _write
        finally:
            if self.previous_hook is not None:
                self.previous_hook(op, exc)

    def dump(self, path: str | os.PathLike | None = None, *, note: str | None = None,
             exc: BaseException | None = None, op: str | None = None,
             op_id: int | None = None, rule: str | None = None, nodes=None,
             record_violation: bool = True) -> Path | None:
        """Write an on-demand bundle (``cache.dump_bundle(path)`` lands here).

        Args:
            path: the file; default a new name in ``directory``.
            note: why it was taken (stored in the bundle).
            exc: an exception to record with it (e.g. an ``InvariantViolation`` from
                ``cache.check()``).
            op: the operation ``exc`` came from (``"check"``...).
            op_id: the recorded op the failure is blamed on (e.g. the op right before a
                ``check()`` that failed); the bundle's failure names that op, its request and
                seqs.
            rule: the broken rule (an invariant's name, a guard's rule).
            nodes: the node ids involved.
            record_violation: announce ``exc`` as a violation in the run's store (False when
                the caller records its own report).

        Returns:
            The bundle's path, or None when writing failed (logged and counted).
        """
        blame = {"op_id": op_id, "rule": rule, "nodes": nodes, "announce": record_violation}
        if path is not None:
            return self._write(Path(path), exc, op, note, fresh=False, **blame)
        return self._write(self.path_for(op or "dump"), exc, op, note, **blame)

    def path_for(self, op: str) -> Path:
        """A fresh bundle path: ``<directory>/bundle-<time>-<pid>-<n>-<op>.db``."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in str(op))[:32]
        return self.directory / f"bundle-{stamp}-{os.getpid()}-{next(self._count):03d}-{safe}.db"

    def uninstall(self) -> None:
        """Put back the previous hook and drop ``cache.bundle_writer``."""
        if self.cache.error_hook is self:
            self.cache.error_hook = self.previous_hook
        if getattr(self.cache, "bundle_writer", None) == self.dump:
            self.cache.bundle_writer = None

    def _write(self, target: Path, exc: BaseException | None, op: str | None,
               note: str | None, fresh: bool = True, op_id: int | None = None,
               rule: str | None = None, nodes=None, announce: bool = True) -> Path | None:
        """Write one bundle. ``write_bundle`` creates the file exclusively; a generated name
        (``fresh``) that another bundler took in the meantime (same second, same process) is
        retried with a unique suffix, so no bundle replaces another."""
        with self._lock:
            try:
                for attempt in range(_NAME_RETRIES):
                    try:
                        path = write_bundle(self.cache, target, exc, self.recorder, op=op,
                                            n_ops=self.n_ops, cuda_memory=self.cuda_memory,
                                            note=note, op_id=op_id, rule=rule, nodes=nodes)
                        break
                    except FileExistsError:
                        if not fresh or attempt == _NAME_RETRIES - 1:
                            raise
                        target = target.with_name(f"{target.stem.split('~')[0]}~"
                                                  f"{uuid.uuid4().hex[:8]}{target.suffix}")
            except Exception as e:  # noqa: BLE001 - telemetry never raises into the cache
                self.failures += 1
                log.exception("crash bundle %s failed: %r", target, e)
                return None
            self.written.append(path)
            log.error("crash bundle written: %s (%s)", path,
                      f"{type(exc).__name__} in {op}" if exc is not None else note or "on demand")
            self._announce(path, exc if announce else None, op, note)
            return path

    def _announce(self, path: Path, exc: BaseException | None, op: str | None,
                  note: str | None) -> None:
        tel = self.telemetry
        if tel is None:
            return
        seq = int(getattr(self.cache, "seq", 0))
        tel.record_event("bundle", {"path": str(path), "op": op, "note": note,
                                    "exception": type(exc).__name__ if exc else None}, seq=seq)
        if exc is not None:
            tel.record_violation(f"{type(exc).__name__} in {op}: {exc}", seq=seq,
                                 kind="oom" if type(exc).__name__ == "CacheOutOfMemory"
                                 else "exception", details={"bundle": str(path), "op": op})


def install_crash_bundles(cache: Any, directory: str | os.PathLike, recorder: Any = None, *,
                          telemetry: Any = None, max_bundles: int = 8, n_ops: int | None = None,
                          cuda_memory: bool = False) -> CrashBundler:
    """Write a crash bundle whenever a cache operation raises, and enable on-demand bundles.

    Args:
        cache: the ``HiRadixCache``.
        directory: where bundles go (created if missing).
        recorder: the flight recorder (default ``cache.recorder``; a
            ``radixscope.telemetry.capture.flight.KeyframedFlightRecorder`` or ``telemetry.setup(...).recorder``).
        telemetry: a ``radixscope.telemetry.Telemetry`` handle: each bundle is announced in its store
            (a ``bundle`` event, and a violation for a failure).
        max_bundles: failures bundled at most (a failure loop does not fill the disk).
        n_ops: op records kept per bundle (default: the recorder's whole ring).
        cuda_memory: include torch's CUDA memory snapshot (CUDA caches only).

    Returns:
        The installed ``CrashBundler`` (``.written`` lists the bundles; ``.uninstall()``).

    Raises:
        TypeError: ``cache`` has no ``error_hook``.
        ValueError: ``directory`` is a file; ``max_bundles`` below 1.
    """
    if not hasattr(cache, "error_hook"):
        raise TypeError(f"install_crash_bundles needs a HiRadixCache, got {type(cache).__name__}")
    if isinstance(max_bundles, bool) or not isinstance(max_bundles, int) or max_bundles < 1:
        raise ValueError(f"max_bundles={max_bundles!r}: must be an int >= 1")
    d = Path(directory).expanduser().absolute()
    if d.exists() and not d.is_dir():
        raise ValueError(f"crash bundle directory {str(d)!r} is a file")
    d.mkdir(parents=True, exist_ok=True)
    b = CrashBundler(cache, d, recorder, telemetry, max_bundles, n_ops, cuda_memory)
    b.previous_hook = cache.error_hook
    cache.error_hook = b
    cache.bundle_writer = b.dump
    return b


class SignalTrigger:
    """A signal asks for an on-demand bundle; ``service()`` writes it on the caller's thread.

    Args:
        bundler: the installed ``CrashBundler``.
        signum: the signal (default ``SIGUSR1``). Must be installed from the main thread.
    """

    def __init__(self, bundler: CrashBundler, signum: int = signal.SIGUSR1) -> None:
        self.bundler = bundler
        self.signum = signum
        self.requested = threading.Event()
        self._previous = signal.signal(signum, self._handler)

    def _handler(self, signum: int, frame: object) -> None:
        self.requested.set()  # only a flag: the cache may be mid-operation

    def service(self) -> Path | None:
        """Write the requested bundle, if one was asked for since the last call."""
        if not self.requested.is_set():
            return None
        self.requested.clear()
        return self.bundler.dump(note=f"on demand: signal {signal.Signals(self.signum).name}")

    def close(self) -> None:
        """Restore the previous handler."""
        signal.signal(self.signum, self._previous)
