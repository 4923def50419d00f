"""Waiting for a Streamlit server a test started (``radixscope ui``): bounded, and a failure
shows the tail of the server's log."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from typing import IO

import pytest


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
