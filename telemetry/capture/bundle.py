"""Crash bundles: one SQLite file with everything a post-mortem needs, no pickle anywhere.

A bundle *is* a small telemetry store (``telemetry/store/schema.py``'s schema), so
``telemetry.open_store(bundle)`` reads it too; ``telemetry.analysis.load.load_bundle`` adds the
failure on top. What goes in:

- ``ops`` / ``mutations``: the flight recorder's window (last N op records, every mutation since
  the window's start). Ops carry the caller's trace id and span id (``trace_id``,
  ``parent_span_id``) to join them with the engine's request spans; ``span_id`` is empty.
- ``keyframes``: the exact state at the window's start when the recorder can give one
  (``KeyframedFlightRecorder``, or any recorder whose ring has not wrapped), so ``state_at``
  rebuilds every seq in the window; otherwise the live snapshot at the failure only.
- ``metrics``: pool figures (capacity / available / evictable / protected / in flight) after
  every op of the window, from a replay of the window (the budget timeline).
- ``violations``: the failure itself and whatever ``cache.check()`` finds at bundle time.
- ``info`` rows (JSON): ``bundle`` (format, trigger, window, replay check, row counts),
  ``failure`` (op, exception, traceback, frames, node, OOM numbers), ``live_snapshot``,
  ``cache``, ``config``, ``ledgers``, ``metrics`` (recorder health), ``prefetches`` (the L3
  prefetches pending at bundle time: ``cache.pending_prefetches()``, [] without storage) and,
  under CUDA when asked, ``cuda_memory``.

The file is written under a unique temporary name and published atomically and exclusively (a
hard link: an existing bundle is never replaced unless ``overwrite``): a reader never sees half
a bundle, and ``load_bundle`` checks the row counts and a SHA-256 per table, and over every
``info`` row but the manifest itself, against the manifest to catch truncation and damage
(the digests detect damage, not forgery: a crafted file is made safe by the loader reading
only what it has verified, in bounded time).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace

from radixscope.cache.snapshot import CacheSnapshot
from radixscope.telemetry.capture import crash_window as window_
from radixscope.telemetry.capture import failure as failure_
from radixscope.telemetry.capture.replaycheck import replay_check
from radixscope.telemetry.store.bundle_format import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    COUNTED_TABLES,
    DIGESTED,
    table_digest,
)
from radixscope.telemetry.store.jsontext import dumps, journal_chunk
from radixscope.telemetry.store.schema import SCHEMA, SCHEMA_NAME, SCHEMA_VERSION

TRIGGER_ERROR = "error"
TRIGGER_ON_DEMAND = "on_demand"


def write_bundle(cache: Any, path: str | os.PathLike, exc: BaseException | None = None,
                 recorder: Any = None, *, op: str | None = None, n_ops: int | None = None,
                 cuda_memory: bool = False, note: str | None = None,
                 overwrite: bool = False, op_id: int | None = None, rule: str | None = None,
                 nodes=None) -> Path:
    """Write a crash bundle for ``cache`` at ``path``.

    Args:
        cache: the ``HiRadixCache``.
        path: the bundle file to create (parent directories are made).
        exc: the exception that triggered it (None for an on-demand bundle).
        recorder: the flight recorder (default ``cache.recorder``).
        op: the cache operation that raised, when known.
        n_ops: keep only the last ``n_ops`` op records (default: the whole ring).
        cuda_memory: under CUDA, include ``torch.cuda.memory._snapshot()``.
        note: free text stored with the bundle (why it was taken).
        overwrite: replace an existing file instead of raising ``FileExistsError``.
        op_id: blame the failure on this recorded op (one that completed: the op right before
            a failed ``check()``, the last op before an engine guard fired).
        rule: the broken rule (default: the first violation's name, or ``exc.rule``).
        nodes: the node ids involved (default: the violations' nodes, or ``exc.nodes``).

    Returns:
        The bundle's absolute path.

    Raises:
        TypeError: ``cache`` is not a cache.
        ValueError: ``path`` names a directory; ``n_ops`` below 0.
        FileExistsError: the file exists and ``overwrite`` is False.
    """
    if not (hasattr(cache, "snapshot") and hasattr(cache, "check") and hasattr(cache, "comps")):
        raise TypeError(f"write_bundle needs a HiRadixCache, got {type(cache).__name__}")
    if n_ops is not None and (isinstance(n_ops, bool) or not isinstance(n_ops, int) or n_ops < 0):
        raise ValueError(f"n_ops={n_ops!r}: must be None or an int >= 0")
    target = _target(path, overwrite)
    recorder = cache.recorder if recorder is None else recorder
    win = window_.capture(cache, recorder, n_ops, op, exc, op_id)
    live = cache.snapshot()
    checked = _check(cache)
    fail = failure_.describe(exc, op, win.failing_op.attrs if win.failing_op else None,
                             rule=rule, nodes=nodes)
    fail.update(seq=live.seq, trigger=TRIGGER_ERROR if exc is not None else TRIGGER_ON_DEMAND,
                note=note, op_id=None, req_id=None, op_seqs=None, ts_ns=time.time_ns())
    if win.failing_op is not None:
        f_op = win.failing_op
        fail.update(op_id=f_op.op_id, req_id=f_op.req_id, op_seqs=[f_op.seq_first, f_op.seq_last])
    if fail["node"] is None:
        fail["node"] = next((v[1] for v in checked if v[1] is not None), None)
    timeline, replayed = replay_check(win.start, win.ops, win.mutations, live)
    rows = _Rows(win, live, checked, fail, timeline)
    meta = {
        "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "written_ns": time.time_ns(),
        "trigger": fail["trigger"], "window": win.describe(live.seq),
        "replay": replayed, "rows": rows.counts(),
    }
    info = {
        "schema": {"name": SCHEMA_NAME, "version": SCHEMA_VERSION},
        "created_ns": meta["written_ns"], "bundle": meta, "failure": fail,
        "live_snapshot": live.to_dict(), "cache": _cache_info(cache, recorder),
        "config": cache.config.summary(), "ledgers": ledgers(cache, live),
        "metrics": _health(cache, recorder), "check": {"ok": not checked, "violations": checked},
        "last_seq": live.seq, "prefetches": pending_prefetches(cache),
    }
    cm = failure_.cuda_memory(str(cache.config.device), cuda_memory)
    if cm is not None:
        info["cuda_memory"] = cm
    _write(target, info, rows, overwrite)
    return target


def pending_prefetches(cache: Any) -> list[dict]:
    """The cache's pending L3 prefetches as plain dicts (``PrefetchState`` fields); [] for a
    cache without storage. A failure to read them is one entry ``{"error": ...}``: a bundle is
    written whatever the cache's state."""
    get = getattr(cache, "pending_prefetches", None)
    if get is None or getattr(cache, "storage", None) is None:
        return []
    try:
        out = []
        for p in get():
            d = dataclasses.asdict(p) if dataclasses.is_dataclass(p) else dict(vars(p))
            out.append({k: v for k, v in d.items()
                        if isinstance(v, (str, int, float, bool)) or v is None})
        return out
    except Exception as e:  # noqa: BLE001 - the crash path records what it can
        return [{"error": f"{type(e).__name__}: {e}"}]


def ledgers(cache: Any, live: CacheSnapshot) -> list[dict]:
    """Per component x tier: the allocator's free count, the ledgers, request-held slots and
    in-flight amounts (from ``live``, the cache's snapshot now), read from the live cache."""
    snap_pools = {(p.component, p.tier): p for p in live.pools}
    out = []
    for comp in cache.comps:
        for ti in cache.pool_tiers:
            tier = ti.label
            alloc = cache.pool(comp.index, ti).alloc
            held = cache.request_held[comp.index][ti]
            p = snap_pools[(comp.name, tier)]
            out.append({"component": comp.name, "tier": tier, "capacity": alloc.capacity,
                        "available": alloc.available, "evictable": cache.evictable[comp.index][ti],
                        "protected": cache.protected[comp.index][ti], "request_held": held,
                        "in_flight": p.in_flight})
    return out


# ---- pieces ----------------------------------------------------------------------------------
def _target(path: str | os.PathLike, overwrite: bool) -> Path:
    if path is None or str(path) == "":
        raise ValueError(f"bundle path {path!r}: must be a non-empty file path")
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise ValueError(f"bundle path {str(p)!r} is a directory, not a file")
    if p.exists() and not overwrite:
        raise FileExistsError(f"bundle {str(p)!r} already exists (pass overwrite=True)")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _check(cache: Any) -> list[list]:
    from radixscope.cache.errors import InvariantViolation

    found = cache.violations()  # read-only: never re-enters the crash hook
    return failure_.violation_rows(InvariantViolation(found)) if found else []


def _cache_info(cache: Any, recorder: Any) -> dict:
    info = getattr(recorder, "info", None)
    return dict(info) if info else cache.info()


def _health(cache: Any, recorder: Any) -> dict:
    out: dict[str, Any] = {"recorder_errors": getattr(cache, "recorder_errors", 0),
                           "recorder": type(recorder).__name__ if recorder is not None else None}
    health = getattr(recorder, "health", None)
    if health is not None and hasattr(health, "snapshot"):
        out["telemetry"] = health.snapshot()
    return out


class _Rows:
    """The table rows of a bundle, built once (so the manifest counts what is written)."""

    def __init__(self, win: window_.Window, live: CacheSnapshot, checked: list[list],
                 fail: dict, timeline: list[tuple]) -> None:
        self.ops = []
        for o in win.ops:
            tid, pid = _caller_ids(o.context)
            self.ops.append((o.op_id, o.op, o.start_ns, o.end_ns, o.req_id, o.seq_first,
                             o.seq_last, tid, None, pid, dumps(o.attrs or {}), o.error))
        self.mutations = list(win.mutations)  # in seq order (Window)
        start = win.start if win.start is not None else live
        self.keyframes = [(start.seq, fail["ts_ns"], json.dumps(start.to_dict(),
                                                                separators=(",", ":")))]
        self.metrics = timeline
        ts = fail["ts_ns"]
        self.violations = []
        if fail["exception"] is not None:
            kind = "oom" if fail["oom"] else ("invariant" if fail["violations"] else "exception")
            self.violations.append((ts, live.seq, kind, f"{fail['exception']} in "
                                    f"{fail['op'] or 'an on-demand check'}: {fail['message']}",
                                    dumps({"op": fail["op"], "op_id": fail["op_id"],
                                           "node": fail["node"], "oom": fail["oom"]})))
        for name, node, detail in checked:
            self.violations.append((ts, live.seq, "invariant", f"[{name}] node={node}: {detail}",
                                    dumps({"name": name, "node": node, "detail": detail})))
        self.events = [(ts, live.seq, "bundle", dumps({"trigger": fail["trigger"],
                                                       "op": fail["op"], "note": fail["note"]}))]

    def counts(self) -> dict[str, int]:
        return {t: len(getattr(self, t)) for t in COUNTED_TABLES}


def _caller_ids(ctx: Any) -> tuple[str | None, str | None]:
    """Hex trace id and span id of the caller's span captured with an op (None, None if none)."""
    if ctx is None:
        return None, None
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return None, None
    return format(sc.trace_id, "032x"), format(sc.span_id, "016x")


def _write(target: Path, info: dict, rows: _Rows, overwrite: bool) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        con = sqlite3.connect(tmp, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=DELETE")
            con.executescript("BEGIN;" + SCHEMA + "COMMIT;")
            con.execute("BEGIN")
            con.executemany("INSERT INTO info VALUES (?, ?)",
                            [(k, dumps(v)) for k, v in info.items()])
            con.executemany("INSERT INTO ops VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows.ops)
            if rows.mutations:
                con.execute("INSERT INTO journal VALUES (?,?,?)", journal_chunk(rows.mutations))
            con.executemany("INSERT INTO keyframes VALUES (?,?,?)", rows.keyframes)
            con.executemany("INSERT INTO metrics VALUES (?,?,?,?,?,?,?,?,?)", rows.metrics)
            con.executemany("INSERT INTO violations (ts_ns, seq, kind, message, details) "
                            "VALUES (?,?,?,?,?)", rows.violations)
            con.executemany("INSERT INTO events (ts_ns, seq, kind, attrs) VALUES (?,?,?,?)",
                            rows.events)
            digests = {t: table_digest(con, t) for t in DIGESTED}
            meta = dict(info["bundle"], digests=digests)
            con.execute("UPDATE info SET value = ? WHERE key = 'bundle'", (dumps(meta),))
            con.execute("COMMIT")
        finally:
            con.close()
        publish(tmp, target, overwrite)
    finally:
        tmp.unlink(missing_ok=True)


def publish(tmp: Path, target: Path, overwrite: bool) -> None:
    """Move the finished file ``tmp`` to ``target`` atomically: replacing it when
    ``overwrite``, else only if nothing is there (a hard link fails on an existing name; where
    links are not supported, the name is claimed with an exclusive create first).

    Raises:
        FileExistsError: ``target`` exists and ``overwrite`` is False.
    """
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise FileExistsError(f"bundle {str(target)!r} already exists (pass overwrite=True)"
                              ) from None
    except OSError:  # no hard links here: claim the name, then replace the empty claim
        with open(target, "x"):
            pass
        os.replace(tmp, target)
    else:
        tmp.unlink()
