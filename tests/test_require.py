"""The CI switch for machine tools: absent means skipped, unless RADIXSCOPE_REQUIRE names it."""

from __future__ import annotations

import pytest

from tests.kits.require import missing


def test_an_absent_tool_skips_unless_required(monkeypatch) -> None:
    monkeypatch.delenv("RADIXSCOPE_REQUIRE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no redis"):
        missing("redis-server", "no redis")
    monkeypatch.setenv("RADIXSCOPE_REQUIRE", "chromium, redis-server")
    with pytest.raises(pytest.fail.Exception, match="requires 'redis-server'"):
        missing("redis-server", "no redis")
    with pytest.raises(pytest.skip.Exception):
        missing("mooncake", "no mooncake")
