"""Which store the app shows, and whether it is still being written (pure helpers).

``radixscope ui STORE`` runs ``streamlit run ui/app.py -- --store STORE --root DIR``; the
environment variables ``RADIXSCOPE_STORE`` / ``RADIXSCOPE_ROOT`` are the fallbacks. The sidebar
can switch to another store, but only to one under the root (``--root``, else the store's folder,
else the working directory): ``confine`` refuses anything else, ``..`` and symlinks leading out
included, with one message that does not say whether the path exists.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_VAR = "RADIXSCOPE_STORE"
ROOT_ENV_VAR = "RADIXSCOPE_ROOT"
LIVE_WINDOW_S = 30.0


def store_from_args(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The store path from ``--store PATH`` in ``argv`` (unknown arguments are ignored), else
    from ``RADIXSCOPE_STORE``, else None."""
    ns = _parse(argv)
    if ns.store:
        return str(ns.store)
    v = env.get(ENV_VAR, "").strip()
    return v or None


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--store", default=None)
    p.add_argument("--root", default=None)
    ns, _rest = p.parse_known_args(list(argv))
    return ns


def root_from_args(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> str:
    """The folder whose stores the app may open (absolute, symlinks resolved): ``--root``, else
    ``RADIXSCOPE_ROOT``, else the folder of the store (``store_from_args``), else ``cwd``."""
    root = _parse(argv).root or env.get(ROOT_ENV_VAR, "").strip()
    if not root:
        store = store_from_args(argv, env)
        root = os.path.dirname(os.path.abspath(store)) if store else (cwd or os.getcwd())
    return os.path.realpath(root)


def outside_root_message(path: str, root: str) -> str:
    """The one refusal for any path outside the root (the same whether or not it exists)."""
    return (f"{path!r} is outside the folder this UI may open ({root}); choose a store under it "
            "(start `radixscope ui STORE --root DIR` for another folder)")


def confine(path: str, root: str) -> str:
    """``path`` (relative paths are taken from ``root``) resolved, symlinks and ``..`` included,
    if it lies under ``root``; else ValueError with ``outside_root_message``.

    Decides without asking whether ``path`` exists: a path outside the root is refused the same
    way whether it is a file, a folder, a link or nothing.
    """
    real_root = os.path.realpath(root)
    if "\0" in path:
        raise ValueError(outside_root_message(path, real_root))
    full = os.path.realpath(os.path.join(real_root, os.path.expanduser(path)))
    if os.path.commonpath([real_root, full]) != real_root:
        raise ValueError(outside_root_message(path, real_root))
    return full


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
