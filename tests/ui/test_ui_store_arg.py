"""ui.store_arg: where the store path comes from, and the live-store heuristic."""

from __future__ import annotations

import os

from radixscope.ui.store_arg import ENV_VAR, last_write_s, looks_live, store_from_args


def test_store_from_args_then_env():
    assert store_from_args(["--store", "runs/a.db"], {ENV_VAR: "b.db"}) == "runs/a.db"
    assert store_from_args(["--store=runs/a.db", "--other", "1"], {}) == "runs/a.db"
    assert store_from_args(["-x"], {ENV_VAR: " b.db "}) == "b.db"
    assert store_from_args([], {ENV_VAR: ""}) is None
    assert store_from_args([], {}) is None


def test_looks_live_by_modification_time(tmp_path):
    p = tmp_path / "s.db"
    assert last_write_s(p) is None and not looks_live(p)
    p.write_bytes(b"x")
    os.utime(p, (1000.0, 1000.0))
    assert last_write_s(p) == 1000.0
    assert looks_live(p, now=1020.0) and not looks_live(p, now=1031.0)
    wal = tmp_path / "s.db-wal"
    wal.write_bytes(b"y")
    os.utime(wal, (2000.0, 2000.0))
    assert last_write_s(p) == 2000.0 and looks_live(p, now=2029.0)
