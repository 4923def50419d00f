"""The UI follows the store file, not a cached handle: when a new run replaces the store at the
same path, the next rerun shows the new run (issue 12, item 13)."""

from __future__ import annotations

import os
from pathlib import Path

from streamlit.testing.v1 import AppTest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.ui import data
from tests.kits.cachekit import Driver, make_config

APP = str(Path(__file__).resolve().parents[2] / "ui" / "app.py")


def _run(path: Path, n: int) -> int:
    """A store at ``path`` written by a run of ``n`` inserts; its last seq."""
    tel = telemetry.setup(store=path, mode="inline", capture_host_spans=False)
    c = HiRadixCache(make_config(device_tokens=256, host_tokens=512), recorder=tel.recorder)
    d = Driver(c)
    for i in range(n):
        d.insert([i, i + 1, i + 2, 99], req_id=f"r{i}")
    tel.close()
    return c.snapshot().seq


def _replace(path: Path, n: int) -> int:
    """What a new run does: write the store elsewhere and rename it over the old one."""
    fresh = path.with_name("fresh-" + path.name)
    seq = _run(fresh, n)
    os.replace(fresh, path)
    return seq


def test_store_identity_changes_when_the_file_is_replaced(tmp_path):
    path = tmp_path / "run.db"
    assert data.store_identity(str(path)) is None
    _run(path, 2)
    first = data.store_identity(str(path))
    assert first is not None and data.store_identity(str(path)) == first
    _replace(path, 3)
    assert data.store_identity(str(path)) not in (None, first)


def test_ui_shows_the_new_run_after_the_store_was_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSCOPE_ROOT", str(tmp_path))  # the UI opens stores under its root
    path = tmp_path / "run.db"
    old = _run(path, 3)
    at = AppTest.from_file(APP, default_timeout=90)
    at.session_state["store_path"] = str(path)
    at.session_state["live"] = False
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert f"## Radix tree at seq {old:,}" in [m.value for m in at.markdown]
    new = _replace(path, 12)
    assert new != old
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [m.value for m in at.markdown]
    assert f"## Radix tree at seq {new:,}" in shown, shown[:3]
    at.switch_page("app_pages/health.py").run()
    assert f"## Health at seq {new:,}" in [m.value for m in at.markdown]
