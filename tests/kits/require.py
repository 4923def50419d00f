"""Tools a test needs from the machine (Debian's redis-server, chromium): a test skips when one
is absent, unless ``RADIXSCOPE_REQUIRE`` names it — `.ci/run` does, so in CI a missing tool is a
failure, never a silently skipped test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = "RADIXSCOPE_REQUIRE"


def required(tool: str) -> bool:
    return tool in {t.strip() for t in os.environ.get(ENV, "").split(",") if t.strip()}


def missing(tool: str, reason: str) -> None:
    """Skip (or, when ``RADIXSCOPE_REQUIRE`` names ``tool``, fail) with ``reason``."""
    if required(tool):
        pytest.fail(f"{reason} ({ENV} requires {tool!r})")
    pytest.skip(reason)


def pass_without_native(tests: list[str]) -> None:
    """Run ``tests`` (pytest node ids) in a subprocess with ``RADIXSCOPE_NATIVE=0``, as on a
    machine with no C compiler, after checking that this does select the Python versions of
    the cache's kernels, ledger and leaf heap and the recorder's encoder; fail with the output
    unless they pass."""
    root = Path(__file__).resolve().parents[2]
    # the native parts are off on purpose there: a test that needs them skips
    tools = [t.strip() for t in os.environ.get(ENV, "").split(",") if t.strip() != "native"]
    env = {**os.environ, "RADIXSCOPE_NATIVE": "0", ENV: ",".join(t for t in tools if t)}
    probe = subprocess.run([sys.executable, "-c", "from radixscope.cache import ledger, leaves, "
                            "native; from radixscope.telemetry.record import sink; "
                            "print(native.KERNELS, ledger.LEDGER, leaves.LEAF_HEAP, sink.ENCODER)"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["python"] * 4, probe.stdout
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *tests], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout
