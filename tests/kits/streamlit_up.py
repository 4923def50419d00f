"""Waiting for a Streamlit server a test started (``radixscope ui``): bounded, and a failure
shows the tail of the server's log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.kits.ports import free_port


def wait_healthy(proc: subprocess.Popen, port: int, log: IO, timeout_s: float = 60) -> None:
    """Return once ``http://127.0.0.1:PORT/_stcore/health`` answers 200; fail the test if the
    process exits or ``timeout_s`` passes first."""
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                        timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            log.seek(0)
            pytest.fail(f"radixscope ui did not start on port {port}:\n{log.read()[-3000:]}")
        time.sleep(0.3)


@contextlib.contextmanager
def started_ui(store, log_dir, env: dict[str, str], timeout_s: float = 60,
               args: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen, int]]:
    """``radixscope ui STORE --port N [ARGS]`` on a free local port with exactly ``env`` (plus
    ``PYTHONPATH``), waited for; yields the process and its port, and stops the whole process
    group it started afterwards."""
    root = Path(__file__).resolve().parents[2]
    port = free_port()
    log = open(Path(log_dir) / "streamlit.log", "w+")  # noqa: SIM115
    # `radixscope ui STORE --port N` (engine/cli.py): streamlit run ui/app.py -- --store STORE
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixscope.engine.cli", "ui", str(store), "--port", str(port),
         *args],
        cwd=root, env=dict(env, PYTHONPATH=str(root)), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        wait_healthy(proc, port, log, timeout_s)
        yield proc, port
    finally:  # the CLI runs streamlit as its child: stop the whole session we started
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


@contextlib.contextmanager
def radixscope_ui(store, log_dir) -> Iterator[str]:
    """``started_ui --headless`` (the flag a user passes, not Streamlit's variable), bound to
    127.0.0.1, no usage stats; yields its URL."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMLIT_SERVER_HEADLESS"}
    env.update(STREAMLIT_SERVER_ADDRESS="127.0.0.1", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    with started_ui(store, log_dir, env, args=("--headless",)) as (_proc, port):
        yield f"http://127.0.0.1:{port}"
