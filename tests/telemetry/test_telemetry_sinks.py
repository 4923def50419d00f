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


class RecordingSink:
    """A sink registered at runtime (one class, one REGISTRY line): in process mode it lives in
    the writer interpreter (built from the host's registration), so it reports its calls into
    a file named by its options."""

    def __init__(self, health, out: str) -> None:
        self.out = out
        self._log("init")

    def _log(self, line: str) -> None:
        with open(self.out, "a") as f:
            f.write(line + "\n")

    def attach(self, info, snapshot, replica) -> None:
        self._log(f"attach {snapshot.seq} {replica is not None}")

    def ops(self, ops, mutations) -> None:
        self._log(f"ops {','.join(o.op for o in ops)} {','.join(str(m[0]) for m in mutations)}")

    def event(self, ts_ns, seq, kind, attrs) -> None:
        self._log(f"event {kind}")

    def flush(self) -> None:
        self._log("flush")

    def close(self) -> None:
        self._log("close")


def _calls(path) -> tuple[list[str], str]:
    lines = path.read_text().splitlines()
    ops = " ".join(x for line in lines if line.startswith("ops ") for x in [line[4:]])
    kept = [line for line in lines if not line.startswith("ops ")]
    return kept, ops


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_sink_registered_at_runtime_gets_every_call_in_both_modes(tmp_path, monkeypatch, mode):
    monkeypatch.setitem(sinkbase.REGISTRY, "recording", f"{__name__}:RecordingSink")
    out = tmp_path / "calls.txt"
    tel = telemetry.setup(store=tmp_path / "s.db", mode=mode, capture_host_spans=False,
                          sinks={"recording": {"out": str(out)}})
    assert tel.sinks == ("spans", "metrics", "recording", "store")
    cache = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(cache).insert([1, 2, 3, 4])
    tel.record_event("note", {"x": 1})
    tel.flush()
    tel.close()
    kept, ops = _calls(out)
    assert kept[:2] == ["init", "attach 0 True"]
    assert "event note" in kept
    assert kept[-3:] == ["flush", "flush", "close"]  # tel.flush, then close's final flush
    assert ops.split(" ")[0].split(",") == ["match", "lock", "alloc", "insert", "unlock"]
    assert [int(s) for s in ops.split(" ")[1].split(",")] == list(range(1, 12))


def test_the_built_in_sinks_are_registered_by_name_and_in_call_order(tmp_path):
    assert sinkbase.BUILTIN == ("spans", "metrics", "store")
    assert {"spans", "metrics", "store", "kv_events"} <= set(sinkbase.REGISTRY)
    for name in sinkbase.BUILTIN:
        cls = sinkbase.resolve(name)
        assert all(callable(getattr(cls, m)) for m in ("attach", "ops", "event", "flush",
                                                        "close"))
    tel = telemetry.setup(store=tmp_path / "s.db", mode="inline", capture_host_spans=False)
    assert tel.sinks == ("spans", "metrics", "store")
    assert list(tel.pipeline.transport.sink.named) == ["spans", "metrics", "store"]
    tel.close()
    tel = telemetry.setup(store=None, mode="inline", spans=False, metrics=False,
                          capture_host_spans=False)
    assert tel.sinks == ()
    tel.close()


def test_a_built_in_sink_is_not_configured_through_sinks():
    with pytest.raises(ValueError, match="'store' is built in"):
        telemetry.setup(store=None, mode="inline", sinks={"store": {"path": "x.db"}})


def test_tuning_knobs_by_options_or_by_their_old_keywords_and_unknown_ones_rejected(tmp_path):
    from radixscope.telemetry import TelemetryOptions
    with pytest.raises(TypeError, match="keyframe_evry"):
        telemetry.setup(store=None, mode="inline", keyframe_evry=3)
    with pytest.raises(ValueError, match="keyframe_every=0"):
        telemetry.setup(store=None, mode="inline", options=TelemetryOptions(keyframe_every=0))
    for kwargs in ({"options": TelemetryOptions(flight_ring=7)}, {"flight_ring": 7}):
        tel = telemetry.setup(store=None, mode="inline", capture_host_spans=False, **kwargs)
        assert tel.recorder.ring_capacity == 7
        tel.close()


class FailsOnCloseSink(ListSink):
    """An exporter whose shutdown fails (an OTLP push that cannot reach its collector)."""

    def close(self) -> None:
        raise RuntimeError("exporter shutdown failed")


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_failure_while_an_exporter_shuts_down_is_in_the_stored_stats_and_the_ack(
        tmp_path, monkeypatch, mode):
    """The store takes its final stats after the exporting sinks closed: a failure during their
    shutdown is kept, not lost after the store was written."""
    monkeypatch.setitem(sinkbase.REGISTRY, "fails_on_close", f"{__name__}:FailsOnCloseSink")
    tel = telemetry.setup(store=tmp_path / "s.db", mode=mode, capture_host_spans=False,
                          sinks={"fails_on_close": {}})
    cache = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(cache).insert([1, 2, 3, 4])
    stats = tel.close()
    assert stats["failures"]["sink.FailsOnCloseSink.close"] == 1
    with telemetry.open_store(tmp_path / "s.db") as r:
        stored = r.info()["stats"]
    assert stored["failures"]["sink.FailsOnCloseSink.close"] == 1
