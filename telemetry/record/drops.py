"""Telemetry's own health: counters of dropped records and failures, and the guard points.

A telemetry failure is logged and counted, never raised into the cache. Every place that could
fail on the way from ``record()`` to a sink runs under ``Health.guard(stage)``, which catches
``Exception``, logs it (the first few with a traceback, then one line per power of two) and
increments ``failures[stage]``. Dropped records are counted per kind (``op``, ``mutation``,
``span``, ``event``) so a reader can account for every record the store does not hold.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("radixscope.telemetry")

DROP_OP = "op"
DROP_MUTATION = "mutation"
DROP_SPAN = "span"
DROP_EVENT = "event"
DROP_KINDS = (DROP_OP, DROP_MUTATION, DROP_SPAN, DROP_EVENT)

_VERBOSE_FAILURES = 3  # failures per stage logged with a traceback before going quiet


class Health:
    """Thread-safe counters of dropped records, failures and journal anomalies.

    Increments take a lock; they happen on failure paths and in batches, never per record on
    the cache's hot path.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped: dict[str, int] = dict.fromkeys(DROP_KINDS, 0)
        self.failures: dict[str, int] = {}
        self.notes: dict[str, int] = {}  # journal_gaps, out_of_order, ...

    def drop(self, kind: str, n: int = 1) -> None:
        """Count ``n`` records of ``kind`` that will never reach the sinks."""
        if n <= 0:
            return
        with self._lock:
            self.dropped[kind] = self.dropped.get(kind, 0) + n

    def note(self, name: str, n: int = 1) -> None:
        """Count an anomaly that is not a failure (a journal gap, a late mutation)."""
        with self._lock:
            self.notes[name] = self.notes.get(name, 0) + n

    def fail(self, stage: str, exc: BaseException | None = None, what: str = "") -> None:
        """Log and count one failure at ``stage``.

        Args:
            stage: where it happened (``record``, ``drain``, ``store``, ``exporter.<name>``...).
            exc: the exception, if any (logged with its traceback for the first few).
            what: a short description added to the log line.
        """
        with self._lock:
            n = self.failures.get(stage, 0) + 1
            self.failures[stage] = n
        if n <= _VERBOSE_FAILURES:
            log.error("telemetry failure #%d at %s %s: %r", n, stage, what, exc,
                      exc_info=exc if exc is not None else False)
        elif n & (n - 1) == 0:
            log.error("telemetry failure #%d at %s %s: %r (further ones logged at powers of 2)",
                      n, stage, what, exc)

    @contextmanager
    def guard(self, stage: str, what: str = "") -> Iterator[None]:
        """Run a block; an ``Exception`` in it is logged and counted instead of propagating."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - the telemetry guard point: log + count
            self.fail(stage, e, what)

    @property
    def failure_count(self) -> int:
        with self._lock:
            return sum(self.failures.values())

    def snapshot(self) -> dict:
        """Plain-data copy: ``{"dropped": {...}, "failures": {...}, "notes": {...}}``."""
        with self._lock:
            return {"dropped": dict(self.dropped), "failures": dict(self.failures),
                    "notes": dict(self.notes)}


def merge_stats(*parts: dict) -> dict:
    """Sum several ``Health.snapshot()`` dicts (host side + writer side) key by key.

    Args:
        parts: snapshots to add up; missing sections count as empty.

    Returns:
        One dict of the same shape.
    """
    out: dict[str, dict[str, int]] = {"dropped": {}, "failures": {}, "notes": {}}
    for p in parts:
        for section, counts in out.items():
            for k, v in (p.get(section) or {}).items():
                counts[k] = counts.get(k, 0) + int(v)
    for k in DROP_KINDS:
        out["dropped"].setdefault(k, 0)
    return out
