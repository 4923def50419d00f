"""Tools a test needs from the machine (Debian's redis-server, chromium): a test skips when one
is absent, unless ``RADIXSCOPE_REQUIRE`` names it — `.ci/run` does, so in CI a missing tool is a
failure, never a silently skipped test."""

from __future__ import annotations

import os

import pytest

ENV = "RADIXSCOPE_REQUIRE"


def required(tool: str) -> bool:
    return tool in {t.strip() for t in os.environ.get(ENV, "").split(",") if t.strip()}


def missing(tool: str, reason: str) -> None:
    """Skip (or, when ``RADIXSCOPE_REQUIRE`` names ``tool``, fail) with ``reason``."""
    if required(tool):
        pytest.fail(f"{reason} ({ENV} requires {tool!r})")
    pytest.skip(reason)
