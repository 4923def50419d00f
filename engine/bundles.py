"""Crash bundles of an engine run, next to its store (``<store dir>/bundles/``).

A cache operation that raises (``check()`` finding a broken invariant, a double free, a bug)
writes a bundle before the exception reaches the engine; out-of-memory is not bundled, since the
engine handles it (the request waits). A content mismatch and an exception inside the engine
itself are bundled on demand (``engine.run.execute``), and so is the live cache when the
process gets ``SIGUSR1`` (serviced between steps, on the cache's thread).
Notebooks open bundles with ``telemetry.analysis.load`` (see docs/postmortem.md).
"""

from __future__ import annotations

import threading
from pathlib import Path

from radixscope.cache.errors import CacheOutOfMemory
from radixscope.telemetry.capture.crash import SignalTrigger, install_crash_bundles


class RunBundles:
    """Installs the bundler on ``cache`` (the ``HiRadixCache`` itself) for one run.

    Args:
        cache: the cache.
        store: the run's store path; bundles go to ``<its directory>/bundles``.
        telemetry: the run's telemetry handle (bundles are announced in its store).
    """

    def __init__(self, cache, store: str, telemetry) -> None:
        self.directory = Path(store).expanduser().absolute().parent / "bundles"
        self.bundler = install_crash_bundles(cache, self.directory, recorder=telemetry.recorder,
                                             telemetry=telemetry)
        self.cache = cache
        cache.error_hook = self._hook
        self.trigger = None
        self._seen: list[BaseException] = []
        if threading.current_thread() is threading.main_thread():
            self.trigger = SignalTrigger(self.bundler)

    def _hook(self, op: str, exc: BaseException) -> None:
        if not isinstance(exc, CacheOutOfMemory):
            self._seen.append(exc)
            self.bundler(op, exc)

    def bundled(self, exc: BaseException) -> bool:
        """Whether the cache's hook already bundled ``exc`` (the crash came from the cache)."""
        return any(e is exc for e in self._seen)

    def service(self, engine) -> None:
        """Between steps: write the bundle a signal asked for, if any."""
        if self.trigger is not None:
            self.trigger.service()

    def dump(self, note: str, exc: BaseException | None = None, op: str | None = None,
             **blame) -> Path | None:
        """An on-demand bundle for a problem the engine found (``blame``: ``op_id``, ``rule``,
        ``nodes``: see ``CrashBundler.dump``). With ``blame`` the engine records its own
        violation report, so the bundle is not announced as a second one."""
        if blame:
            blame.setdefault("record_violation", False)
        return self.bundler.dump(note=note, exc=exc, op=op, **blame)

    @property
    def written(self) -> list[Path]:
        return list(self.bundler.written)

    def close(self) -> None:
        if self.trigger is not None:
            self.trigger.close()
        if self.cache.error_hook == self._hook:
            self.cache.error_hook = self.bundler.previous_hook
        self.cache.bundle_writer = None
