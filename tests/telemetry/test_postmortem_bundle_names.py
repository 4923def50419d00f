"""Two bundlers in one process within the same second never lose a bundle (issue 12, item 8):
bundles are created exclusively and a taken name is retried with a unique suffix."""

from __future__ import annotations

import time

import pytest

from radixscope.cache import HiRadixCache
from radixscope.telemetry.analysis.load import load_bundle
from radixscope.telemetry.capture.bundle import write_bundle
from radixscope.telemetry.capture.crash import install_crash_bundles
from tests.kits.cachekit import Driver, make_config


def _cache(tokens: list[int]) -> HiRadixCache:
    c = HiRadixCache(make_config(device_tokens=64, host_tokens=128))
    Driver(c).insert(tokens, req_id="r")
    return c


def test_two_bundlers_in_the_same_second_keep_both_bundles(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20250101-000000")  # one second
    a, b = _cache([1, 2, 3]), _cache([7, 8, 9, 10, 11])
    ba, bb = install_crash_bundles(a, tmp_path), install_crash_bundles(b, tmp_path)
    pa, pb = ba.dump(note="a"), bb.dump(note="b")
    assert pa is not None and pb is not None and pa != pb
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([pa.name, pb.name])
    with load_bundle(pa) as ra, load_bundle(pb) as rb:
        assert ra.snapshot() == a.snapshot() and rb.snapshot() == b.snapshot()
        assert ra.failure()["note"] == "a" and rb.failure()["note"] == "b"


def test_write_bundle_never_replaces_an_existing_file(tmp_path):
    target = tmp_path / "b.db"
    write_bundle(_cache([1, 2]), target)
    before = target.read_bytes()
    with pytest.raises(FileExistsError, match="b.db"):
        write_bundle(_cache([3, 4]), target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["b.db"]  # no temporary file left
    write_bundle(_cache([5, 6]), target, overwrite=True)
    assert target.read_bytes() != before
