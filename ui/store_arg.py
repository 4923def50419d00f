"""Which store the app shows, and whether it is still being written (pure helpers).

``radixscope ui STORE`` runs ``streamlit run ui/app.py -- --store STORE``; the environment
variable ``RADIXSCOPE_STORE`` is the fallback; the sidebar can switch to another path.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_VAR = "RADIXSCOPE_STORE"
LIVE_WINDOW_S = 30.0


def store_from_args(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The store path from ``--store PATH`` in ``argv`` (unknown arguments are ignored), else
    from ``RADIXSCOPE_STORE``, else None."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--store", default=None)
    ns, _rest = p.parse_known_args(list(argv))
    if ns.store:
        return str(ns.store)
    v = env.get(ENV_VAR, "").strip()
    return v or None


def last_write_s(path: str | os.PathLike) -> float | None:
    """Newest modification time of the store file or its ``-wal`` (None when absent)."""
    p = Path(path)
    times = [q.stat().st_mtime for q in (p, p.with_name(p.name + "-wal")) if q.exists()]
    return max(times) if times else None


def looks_live(path: str | os.PathLike, now: float | None = None,
               window_s: float = LIVE_WINDOW_S) -> bool:
    """Whether the store was written within the last ``window_s`` seconds (a run going on)."""
    t = last_write_s(path)
    if t is None:
        return False
    return ((time.time() if now is None else now) - t) <= window_s
