"""Did the run that wrote a store finish cleanly?

The writer records ``info["closed"]`` when it closes the store: ``clean`` true when the host
called ``tel.close()``, false when the host process ended without closing (the writer saw its
pipe close: the run was killed or crashed). A store with no such row was never closed: the run
and its writer were both killed (or it is still being written). ``run_status`` turns that, the
last seq and the last op's time into one sentence ``radixscope doctor``, the UI's Health page
and notebooks show.
"""

from __future__ import annotations

import datetime as dt

CLOSED = "closed"
ENDED = "ended"
UNCLOSED = "unclosed"
BUNDLE = "bundle"


def run_status(info: dict, journal_top: object, keyframe_top: object, last_op_ns: object
               ) -> dict:
    """How the run behind a store ended.

    Args:
        info: the store's decoded ``info``.
        journal_top / keyframe_top: the last journal seq and the last keyframe's seq (or None).
        last_op_ns: the last op's end time (or None).

    Returns:
        ``{"state", "clean", "last_seq", "last_ns", "message"}``: ``state`` is ``"closed"``
        (``tel.close()`` ran), ``"ended"`` (host process died, the writer closed the store),
        ``"unclosed"`` (no close record) or ``"bundle"`` (a crash bundle).
    """
    seqs = [v for v in (journal_top, keyframe_top) if _is_int(v)]
    last_seq = max(seqs) if seqs else None  # type: ignore[type-var]
    last_ns = last_op_ns if _is_int(last_op_ns) else info.get("created_ns")
    at = (f"last seq {last_seq if last_seq is not None else '-'}, last record at "
          f"{format_ns(last_ns)}")
    closed = info.get("closed")
    if "bundle" in info:
        state, clean, msg = BUNDLE, True, f"a crash bundle, not a run's store ({at})"
    elif isinstance(closed, dict) and closed.get("clean") is True:
        state, clean = CLOSED, True
        msg = (f"the run finished cleanly: telemetry closed at {format_ns(closed.get('ts_ns'))} "
               f"({at})")
    elif isinstance(closed, dict):
        state, clean = ENDED, False
        msg = ("the run did NOT finish cleanly: its process ended without closing telemetry "
               f"(killed or crashed); {at}")
    else:
        state, clean = UNCLOSED, False
        msg = ("the run did NOT finish cleanly: the store was never closed (the run and its "
               f"writer were killed, or it is still running); {at}")
    return {"state": state, "clean": clean, "last_seq": last_seq, "last_ns": last_ns,
            "message": msg}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def format_ns(ns: object) -> str:
    """A wall-clock time in ns as ``YYYY-mm-dd HH:MM:SS.mmm UTC`` ("unknown" if not an int)."""
    if isinstance(ns, bool) or not isinstance(ns, int) or not 0 < ns < 2**62:
        return "unknown"
    t = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


__all__ = ["run_status", "format_ns", "CLOSED", "ENDED", "UNCLOSED", "BUNDLE"]
