"""A new output is one ``Sink`` class plus one registration: it sees what the store sees."""

from __future__ import annotations

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.telemetry.sinks import base as sinkbase
from tests.kits.cachekit import Driver, make_config


class ListSink:
    """Keeps every call, in order, as ``(method, summary)``."""

    calls: list = []

    def __init__(self, health, tag: str = "") -> None:
        self.tag = tag
        ListSink.calls = []

    def attach(self, info, snapshot, replica) -> None:
        self.calls.append(("attach", snapshot.seq))

    def ops(self, ops, mutations) -> None:
        self.calls.append(("ops", [o.op for o in ops], [m[0] for m in mutations]))

    def event(self, ts_ns, seq, kind, attrs) -> None:
        self.calls.append(("event", kind))

    def flush(self) -> None:
        self.calls.append(("flush", self.tag))

    def close(self) -> None:
        self.calls.append(("close", self.tag))


class BrokenSink(ListSink):
    def ops(self, ops, mutations) -> None:
        raise RuntimeError("sink bug")


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(sinkbase.REGISTRY, "list", f"{__name__}:ListSink")
    monkeypatch.setitem(sinkbase.REGISTRY, "broken", f"{__name__}:BrokenSink")


def test_a_registered_sink_gets_the_attach_the_ops_with_their_mutations_and_close(
        tmp_path, registered):
    tel = telemetry.setup(store=tmp_path / "s.db", mode="inline", capture_host_spans=False,
                          sinks={"list": {"tag": "t"}})
    cache = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(cache).insert([1, 2, 3, 4])
    tel.close()
    calls = ListSink.calls
    assert calls[0] == ("attach", 0)
    ops = [c for c in calls if c[0] == "ops"]
    assert ops == [("ops", ["match", "lock", "alloc", "insert", "unlock"], list(range(1, 12)))]
    with telemetry.open_store(tmp_path / "s.db") as r:  # the same mutations the store holds
        assert list(r.mutations()["seq"]) == list(range(1, 12))
    assert calls[-2:] == [("flush", "t"), ("close", "t")]


def test_a_failing_sink_is_counted_not_raised(tmp_path, registered):
    tel = telemetry.setup(store=None, mode="inline", capture_host_spans=False,
                          sinks={"broken": {}})
    cache = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(cache).insert([1, 2, 3, 4])
    stats = tel.close()
    assert stats["failures"]["sink.BrokenSink.ops"] >= 1
    assert ListSink.calls[-1] == ("close", "")


def test_an_unregistered_sink_fails_in_setup_naming_it():
    with pytest.raises(ValueError, match="'nope' is not registered"):
        telemetry.setup(store=None, mode="inline", sinks={"nope": {}})
