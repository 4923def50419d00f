"""A one-line progress bar on stderr, redrawn at most every ``interval_s`` (TTY only)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Called after every engine step (``Engine.on_step``); ``close()`` ends the line.

    Args:
        total: requests in the run.
        stream: where to draw (stderr).
        enabled: draw at all; default: only when ``stream`` is a terminal.
        interval_s: least time between redraws.
        width: bar width in characters.
    """

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool | None = None,
                 interval_s: float = 0.1, width: int = 30) -> None:
        self.total = max(1, total)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.interval_s = interval_s
        self.width = width
        self._last = 0.0
        self._drawn = False

    def line(self, done: int, step: int, running: int, waiting: int) -> str:
        filled = self.width * done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        return (f"[{bar}] {done}/{self.total} requests | step {step} | {running} running, "
                f"{waiting} waiting")

    def __call__(self, engine) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        done = len(engine.done) + len(engine.rejected)
        if now - self._last < self.interval_s and done < self.total:
            return
        self._last = now
        self.stream.write("\r" + self.line(done, engine.step_no, len(engine.running),
                                           len(engine.waiting)))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
