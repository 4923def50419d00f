"""Where the CLI writes and binds: a target it cannot use is refused before anything is
replaced (exit 2, one line naming it), and a run whose telemetry failed anyway says its store
is incomplete (exit 1). Real ZMQ sockets on 127.0.0.1, real stores."""

from __future__ import annotations

import json

import pytest
import zmq

from radixscope.engine.cli import main
from radixscope.telemetry import open_store
from radixscope.telemetry.kvevents import publisher
from tests.kits.storagekit import free_port

SMALL = ["--workload", "fewshot", "--requests", "6", "--no-progress"]


@pytest.fixture
def held_port():
    """A loopback port bound by another PUB socket (another engine's publisher)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield port
    finally:
        sock.close()
        ctx.term()


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "keep.db"
    assert main(["run", *SMALL, "--store", str(path)]) == 0
    return path


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("flags", [["--kv-events", "{held}"],
                                   ["--kv-events", "tcp://127.0.0.1:{free}",
                                    "--kv-events-replay", "{held}"]],
                         ids=["pub", "replay"])
def test_a_kv_events_endpoint_in_use_is_refused_before_the_store_is_replaced(
        flags, held_port, store, capsys):
    before = open_store(store).last_seq()
    capsys.readouterr()
    args = [f.format(held=f"tcp://127.0.0.1:{held_port}", free=free_port()) for f in flags]
    assert main(["run", *SMALL, "--store", str(store), *args]) == 2
    line = _one_error_line(capsys)
    assert f"tcp://127.0.0.1:{held_port}: cannot bind it: Address already in use" in line, line
    assert open_store(store).last_seq() == before


@pytest.mark.parametrize("args,needle", [
    (["--kv-events-replay", "tcp://127.0.0.1:5999"], "needs --kv-events"),
    (["--kv-events", "tcp://127.0.0.1:5999", "--no-store"], "drop --no-store"),
])
def test_kv_events_options_that_would_be_ignored_are_refused(args, needle, capsys):
    assert main(["run", *SMALL, *args]) == 2
    assert needle in _one_error_line(capsys)


def test_a_kv_events_run_leaves_the_callers_environment_as_it_was(held_port, store, capsys):
    """``--kv-events`` reaches telemetry through its variables for the run only: a caller of
    ``main`` in its own process (and every later ``telemetry.setup`` there) does not inherit
    them, whether the run ran or was refused."""
    import os

    from radixscope.telemetry.kvevents.config import ENV_ENDPOINT, ENV_REPLAY

    assert ENV_ENDPOINT not in os.environ and ENV_REPLAY not in os.environ
    free = f"tcp://127.0.0.1:{free_port()}"
    assert main(["run", *SMALL, "--store", str(store), "--kv-events", free,
                 "--kv-events-replay", f"tcp://127.0.0.1:{free_port()}"]) == 0
    assert main(["run", *SMALL, "--store", str(store),
                 "--kv-events", f"tcp://127.0.0.1:{held_port}"]) == 2
    assert ENV_ENDPOINT not in os.environ and ENV_REPLAY not in os.environ
    capsys.readouterr()


def test_a_run_whose_telemetry_writer_failed_says_its_store_is_incomplete(
        held_port, tmp_path, monkeypatch, capsys):
    """The port taken between the check and the writer's bind (the check is skipped here):
    the run goes on, but its store is incomplete, and it says so and exits 1 rather than
    printing the usual store line with exit 0."""
    monkeypatch.setattr(publisher, "check_endpoints", lambda config: None)
    path = tmp_path / "run.db"
    assert main(["run", *SMALL, "--store", str(path),
                 "--kv-events", f"tcp://127.0.0.1:{held_port}"]) == 1
    out, err = capsys.readouterr()
    assert f"  store        {path}, INCOMPLETE: telemetry failed (" in out, out
    assert f"radixscope run: the store {path} is incomplete: telemetry failed" in err, err


def test_export_never_overwrites_its_store_or_a_file_that_is_not_a_trace(store, tmp_path,
                                                                        capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    for target, needle in ((store, "is the store being exported"),
                           (notes, "exists and is not a Perfetto trace"),
                           ("", "is not a valid file path"),
                           (tmp_path / "no" / "t.json", "does not exist")):
        assert main(["export", str(store), "--perfetto", str(target)]) == 2
        assert needle in _one_error_line(capsys)
    assert open_store(store).last_seq() > 0 and notes.read_text() == "keep me\n"
    trace = tmp_path / "t.json"
    for _ in range(2):  # an earlier trace is replaced
        assert main(["export", str(store), "--perfetto", str(trace)]) == 0
        assert json.loads(trace.read_text())["traceEvents"]
    capsys.readouterr()


def test_watch_refuses_a_malformed_endpoint_before_making_its_store(tmp_path, capsys):
    path = tmp_path / "w.db"
    assert main(["watch", "notanendpoint", "--store", str(path)]) == 2
    assert "'notanendpoint' is not an endpoint to connect to" in _one_error_line(capsys)
    assert main(["watch", "tcp://127.0.0.1:5999", "--replay", "tcp://x y",
                 "--store", str(path)]) == 2
    assert "--replay 'tcp://x y'" in _one_error_line(capsys)
    assert not path.exists()
    capsys.readouterr()
    # a watch store holds an engine's blocks, not operations: its trace is empty, and said so
    assert main(["watch", f"tcp://127.0.0.1:{free_port()}", "--store", str(path),
                 "--max-seconds", "0.3"]) == 0
    assert main(["export", str(path), "--perfetto", str(tmp_path / "w.json")]) == 0
    err = capsys.readouterr().err
    assert "holds no cache operations, spans or samples, so the trace is empty" in err, err


def test_only_failures_that_keep_the_store_make_it_incomplete():
    """An exporter that fails (spans, metrics, KV events) leaves the store whole: the summary
    names it, and only failures of recording, the drain, the writer or the store, or dropped
    records, call the store incomplete (exit 1)."""
    from radixscope.engine.summary import export_problem, telemetry_problem

    stats = {"dropped": {"op": 0, "mutation": 0}, "failures": {
        "span_export": 2, "sink.KvEventPublisher.ops": 1, "kv_events.replay": 1,
        "provider.force_flush": 1}}
    assert telemetry_problem(stats) == ""
    assert export_problem(stats) == ("kv_events.replay 1, provider.force_flush 1, "
                                     "sink.KvEventPublisher.ops 1, span_export 2")
    stats["failures"].update({"close": 1, "sink.StoreSink.ops": 3})
    stats["dropped"]["op"] = 5
    assert telemetry_problem(stats) == ("telemetry failed (close 1, sink.StoreSink.ops 3; "
                                        "logged above); dropped 5 ops")


def test_export_writes_to_a_pipe_without_reading_it(store, tmp_path, capsys):
    """A target that is not a regular file (a FIFO, /dev/stdout) is written as given: the
    check never reads it (reading a FIFO with no writer blocks for ever)."""
    import os
    import threading

    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done: list[int] = []
    writer = threading.Thread(target=lambda: done.append(
        main(["export", str(store), "--perfetto", str(fifo)])), daemon=True)
    writer.start()
    writer.join(60)
    reader.join(10)
    assert done == [0] and json.loads(got[0])["traceEvents"]
    capsys.readouterr()


def test_an_ipc_endpoint_in_use_is_refused_without_taking_its_socket_file(tmp_path):
    """ZMQ's ipc bind would unlink another engine's socket file rather than fail: the check
    connects to it instead, and the owner keeps serving."""
    from radixscope.telemetry.kvevents.config import KvEventsConfig

    path = tmp_path / "kv.sock"
    ctx = zmq.Context()
    owner = ctx.socket(zmq.PUB)
    owner.setsockopt(zmq.LINGER, 0)
    owner.bind(f"ipc://{path}")
    try:
        with pytest.raises(ValueError, match="cannot bind it: Address already in use"):
            publisher.check_endpoints(KvEventsConfig(f"ipc://{path}"))
        assert path.exists()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"ipc://{path}")
        import time
        deadline = time.monotonic() + 10
        while not sub.poll(50):
            assert time.monotonic() < deadline, "the owner no longer serves its endpoint"
            owner.send(b"still here")
        assert sub.recv() == b"still here"
        sub.close()
    finally:
        owner.close()
        ctx.term()
    publisher.check_endpoints(KvEventsConfig(f"ipc://{path}"))  # freed: a stale file is fine


def test_a_page_size_below_one_is_the_configs_error_not_a_division():
    from radixscope.engine.run import RunSpec

    with pytest.raises(ValueError, match="page_size"):
        RunSpec(sizes={"page_size": 0}).cache_config()
