"""``radixscope doctor STORE``: what a store says about a run, in plain words.

The cache's state at the store's last seq (rebuilt from the journal) explained by
``telemetry.analysis.doctor`` (budget per component and tier, what looks wrong), then the invariant and
integrity violations the run recorded, the admission decisions, the L3 tier (prefetches still
pending at the end, stuck ones, host pins leaked by finished prefetches or store transfers:
``telemetry.analysis.storage_doctor``), and telemetry's own health; and first, whether the store
was closed properly (a killed run's store is never "healthy") and whether every request was
rejected (the run did nothing: never "healthy" either). An external engine's store
(``radixscope watch``) has no pool sizes: its budget counts the blocks only.

The store is untrusted: a JSON value of the wrong shape (an event's ``attrs`` that is not an
object, ``stats`` that is not one: the reader's checks, and the doctor's own on what it walks
beyond them) is a ``ValueError`` naming the file.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd

from radixscope.cache.storage.prefetch_policy import PrefetchConfig
from radixscope.telemetry import open_store
from radixscope.telemetry.analysis.doctor import (
    ERROR,
    doctor_report,
    findings,
    pool_sizes_known,
)
from radixscope.telemetry.analysis.storage_doctor import (
    pending_from_events,
    storage_findings,
    storage_words,
)
from radixscope.telemetry.names import EVENT_ADMISSION
from radixscope.telemetry.store.runstate import CLOSED, format_ns


@dataclass(frozen=True)
class DoctorReport:
    text: str
    healthy: bool  # closed properly, some request admitted, no violation, no error finding


def _damaged(path: str, what: str, value: object) -> ValueError:
    return ValueError(f"{path!r} is damaged or not a valid radixscope store: {what} is "
                      f"{type(value).__name__} {str(value)[:40]!r}, not a JSON object")


def _checked(path: str, info: dict, stats: dict) -> None:
    """Raise ``ValueError`` naming ``path`` where a JSON value the doctor walks is not an
    object: ``info["cache"]``, and the ``dropped`` / ``failures`` of the stats (the reader
    checks events' ``attrs`` and the stats themselves)."""
    if not isinstance(info.get("cache", {}), dict):
        raise _damaged(path, 'info["cache"]', info["cache"])
    for key in ("dropped", "failures"):
        if not isinstance(stats.get(key) or {}, dict):
            raise _damaged(path, f'info["stats"]["{key}"]', stats[key])


def _run_line(status: dict, info: dict) -> str:
    """How the store ended. A store closed properly says nothing of how the run went (a run
    stopped by a fault closes its store too): the violations and the verdict say that."""
    if status["state"] != CLOSED:
        return ("run: " if status["clean"] else "run: PROBLEM: ") + status["message"]
    return (f"run: the store was closed properly (telemetry closed at "
            f"{format_ns(info['closed'].get('ts_ns'))}; last seq {status['last_seq']}, last "
            f"record at {format_ns(status['last_ns'])})")


def _rejected_all(attrs: list[dict]) -> list[str]:
    """The problem line when requests were rejected and none admitted (the run's summary:
    ``all N requests were rejected``), naming the first rejection; else nothing."""
    rejected = [a for a in attrs if a.get("rejected")]
    if not rejected or any(a.get("admitted") for a in attrs):
        return []
    first = rejected[0]
    return [f"run: PROBLEM: all {len(rejected)} requests were rejected; the first, "
            f"{first.get('req_id')}: {first.get('reason')}"]


def _violation_lines(df: pd.DataFrame) -> list[str]:
    if df.empty:
        return ["violations: none recorded"]
    out = [f"violations: {len(df)} recorded"]
    for row in df.itertuples(index=False):
        seq = "" if pd.isna(row.seq) else f" at seq {int(row.seq)}"
        out.append(f"  [{row.kind}]{seq}: {row.message}")
    return out


def _reason_key(reason: str) -> str:
    """A refusal reason without its numbers, to group them (``refused: full: ...``)."""
    head = reason.split(";")[0]
    words = [w for w in head.replace(":", " : ").split() if not w.strip("()").isdigit()]
    return " ".join(words[:8])


def _admission_lines(df: pd.DataFrame) -> list[str]:
    if df.empty:
        return ["admissions: none recorded"]
    attrs = list(df["attrs"])
    admitted = sum(1 for a in attrs if a.get("admitted"))
    rejected = [a for a in attrs if a.get("rejected")]
    refused = [a for a in attrs if not a.get("admitted") and not a.get("rejected")]
    out = [f"admissions: {admitted} admitted; {len(refused)} requests were refused at least once "
           f"(they waited in the queue); {len(rejected)} rejected because they could never fit"]
    for label, group in (("refused", refused), ("rejected", rejected)):
        reasons = Counter(_reason_key(str(a.get("reason", ""))) for a in group)
        for key, count in reasons.most_common(3):
            example = next(str(a.get("reason")) for a in group
                           if _reason_key(str(a.get("reason", ""))) == key)
            out.append(f"  {count} {label}, e.g. {example.removeprefix(label + ': ')}")
    return out


def _health_lines(stats: dict) -> list[str]:
    dropped = {k: v for k, v in (stats.get("dropped") or {}).items() if v}
    failures = {k: v for k, v in (stats.get("failures") or {}).items() if v}
    if not dropped and not failures:
        return ["telemetry: nothing dropped, no failures"]
    out = []
    if dropped:
        out.append("telemetry: dropped " + ", ".join(f"{v} {k}" for k, v in dropped.items())
                   + " (the journal may have gaps)")
    if failures:
        out.append("telemetry failures: " + ", ".join(f"{k} x{v}" for k, v in failures.items()))
    return out


def _last_time(ops: pd.DataFrame, events: pd.DataFrame) -> int:
    """The last wall-clock time the store recorded (ns): the doctor's "now"."""
    times = [int(ops["end_ns"].max()) if not ops.empty else 0,
             int(events["ts_ns"].max()) if not events.empty else 0]
    return max(times)


def diagnose(path: str, prefetch_config: PrefetchConfig | None = None) -> DoctorReport:
    """Read the store at ``path`` and explain it.

    Args:
        path: the store.
        prefetch_config: the run's prefetch policy (its budget says when a pending prefetch is
            stuck); default ``PrefetchConfig()``.

    Raises:
        FileNotFoundError / ValueError: no store there, not a store, or a store with no journal.
    """
    with open_store(path) as r:
        info = r.info()
        status = r.run_status()
        seq = r.last_seq()
        snap = r.state_at(seq)
        violations = r.violations()
        events = r.events()
        stats = r.stats()
        last_ns = _last_time(r.ops(), events)
    _checked(path, info, stats)
    admissions = events[events["kind"] == EVENT_ADMISSION] if not events.empty else events
    known = pool_sizes_known(info)
    rejected_all = _rejected_all(list(admissions["attrs"]) if not admissions.empty else [])
    comps = "+".join(snap.components)
    lines = [f"store {path}: {comps} cache, page size {snap.page_size}, journal up to seq {seq}",
             _run_line(status, info), *rejected_all, doctor_report(snap, known)]
    lines += _violation_lines(violations)
    lines += _admission_lines(admissions)
    pending = pending_from_events(events)
    l3 = storage_findings(snap, pending, last_ns, prefetch_config)
    lines += storage_words(pending, l3)
    lines += _health_lines(stats)
    healthy = (violations.empty and status["clean"] and not rejected_all
               and not any(f.severity == ERROR for f in [*findings(snap, known), *l3]))
    lines.append("verdict: " + ("healthy" if healthy else "PROBLEMS FOUND (see above)"))
    return DoctorReport("\n".join(lines), healthy)


__all__ = ["diagnose", "DoctorReport"]
