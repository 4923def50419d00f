"""KV events end to end: our cache publishes, the watcher ingests, blocks() equals the cache.

Also: the recorded SGLang streams through a real socket into ``radixscope watch``, a strict
vLLM-shaped consumer in another process, and bad input that must be counted, never fatal.
"""

from __future__ import annotations

import base64
import json
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.engine.cli import main
from radixscope.engine.doctor import diagnose
from radixscope.engine.run import RunSpec, execute
from radixscope.telemetry.kvevents import wire
from radixscope.telemetry.kvevents.blocks import snapshot_blocks
from radixscope.telemetry.kvevents.publisher import KvEventPublisher, try_endpoint
from radixscope.telemetry.kvevents.watch import Watcher
from tests.kits.cachekit import Driver, make_config
from tests.kits.ports import free_port

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "kv-events"
if not FIXTURES.exists():
    FIXTURES = Path("/work/shared/fixtures/kv-events")
CONSUMER = Path(__file__).parents[1] / "kits" / "kvevents_consumer.py"


def frame_rows(df) -> set:
    return {(r.medium, int(r.group), int(r.hash),
             None if r.parent_hash is None or r.parent_hash is __import__("pandas").NA
             else int(r.parent_hash), tuple(r.token_ids)) for r in df.itertuples()}


def snap_rows(snap) -> set:
    return {(m, g, b.hash, b.parent, b.tokens)
            for (m, g), blocks in snapshot_blocks(snap).items() for b in blocks.values()}


def flush_every(monkeypatch, steps: int, first=None):
    """An ``on_step`` hook that flushes the run's telemetry every ``steps`` engine steps, so
    the publisher sends many messages (it sends one per drained batch); ``first()`` runs at the
    first step, once the run's publisher is bound."""
    import radixscope.engine.run as run_mod
    tels: list = []
    real = run_mod._open_telemetry

    def capture(path, mode):
        tel = real(path, mode)
        tels.append(tel)
        return tel

    monkeypatch.setattr(run_mod, "_open_telemetry", capture)
    count = [0]

    def hook(_engine) -> None:
        count[0] += 1
        if count[0] == 1 and first is not None:
            first()
        if tels and count[0] % steps == 0:
            tels[0].flush()
    return hook


class WatchThread:
    def __init__(self, endpoint: str, store: Path, replay: str | None) -> None:
        self.w = Watcher(endpoint, store, replay=replay)
        # created before the thread uses the socket: tells when the SUB reached a publisher
        self.monitor = self.w._sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.t = threading.Thread(target=self.w.run, kwargs={"max_s": 120}, daemon=True)
        self.t.start()

    def wait_connected(self, timeout_s: float = 20.0) -> None:
        """Block until the SUB socket has completed a handshake with the publisher (which
        binds only once a run starts), then a moment for its subscription to arrive: a PUB
        socket drops what it sends before that, and a run on a fast cache can send every
        message, and close its replay socket, before the SUB's first reconnect."""
        try:
            assert self.monitor.poll(int(timeout_s * 1000)), "the watcher never reached the " \
                "publisher"
        finally:
            self.monitor.close(linger=0)  # the watcher's context ends only once this is closed
        time.sleep(0.1)

    def stop_after(self, messages: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.w.messages < messages and time.monotonic() < deadline:
            time.sleep(0.05)
        self.monitor.close(linger=0)
        self.w.stop()
        self.t.join(timeout=10)
        assert not self.t.is_alive()


@pytest.mark.parametrize("components", [("full",), ("full", "swa")])
def test_round_trip_our_cache_to_watcher(tmp_path, monkeypatch, components) -> None:
    pub, rep = free_port(), free_port()
    monkeypatch.setenv("RADIXSCOPE_KV_EVENTS", f"tcp://127.0.0.1:{pub}")
    monkeypatch.setenv("RADIXSCOPE_KV_EVENTS_REPLAY", f"tcp://127.0.0.1:{rep}")
    watcher = WatchThread(f"tcp://127.0.0.1:{pub}", tmp_path / "watched.db",
                          f"tcp://127.0.0.1:{rep}")
    sent: list[int] = []
    real_send = KvEventPublisher._send

    def lossy_send(self, events):  # the 3rd message never reaches the socket: a forced gap
        if self.seq == 2:
            with self._lock:
                self._buf.append((self.seq, wire.encode_batch(wire.KVEventBatch(
                    ts=time.time(), events=events, data_parallel_rank=0))))
                self.seq += 1
            return
        sent.append(self.seq)
        real_send(self, events)

    monkeypatch.setattr(KvEventPublisher, "_send", lossy_send)
    sizes = {"device_tokens": 512, "host_tokens": 2048}
    if "swa" in components:
        sizes.update(swa_device_tokens=384, swa_host_tokens=2048)
    spec = RunSpec(workload="chat", requests=40, seed=3, components=components, sizes=sizes,
                   store=str(tmp_path / "own.db"), telemetry_mode="inline")
    result = execute(spec, on_step=flush_every(monkeypatch, 2, first=watcher.wait_connected))
    assert result.error is None
    final = result.cache.cache.snapshot()
    n_msgs = max(sent) + 1
    watcher.stop_after(n_msgs)
    assert watcher.w.tree.counts["replayed"] >= 1 and watcher.w.gaps == [], (sorted(watcher.w.tree.counts.items())[4:], watcher.w.gaps, watcher.w.messages, n_msgs)
    with telemetry.open_store(tmp_path / "own.db") as r:
        ops = r.ops()
        assert (ops.op == "load_back").sum() > 0
        assert watcher.w.tree.counts["removed_blocks"] > 0  # evictions reached the watcher
        own = r.blocks()
        assert frame_rows(own) == snap_rows(r.state_at(r.last_seq()))
        # mid-run too: the blocks at a seq are the blocks of the tree at that seq
        mid = r.last_seq() // 2
        assert frame_rows(r.blocks(mid)) == snap_rows(r.state_at(mid))
    expected = snap_rows(final)
    assert {m for m, *_ in expected} == {"GPU", "CPU"}
    assert {g for _, g, *_ in expected} == set(range(len(components)))
    with telemetry.open_store(tmp_path / "watched.db") as w:
        got = w.blocks()
        assert str(got["hash"].dtype) == "UInt64" and str(got["parent_hash"].dtype) == "UInt64"
        assert frame_rows(got) == expected
        info = w.info()
        assert info["engine"]["external"] is True and info["engine"]["live"] is False
        assert w.state_at(w.last_seq()).nodes  # the UI's tree view opens it
    report = diagnose(str(tmp_path / "watched.db"))  # no pool sizes: no capacity alarms
    assert report.healthy, report.text


@pytest.mark.parametrize("scenario", ["sglang-full-p1", "sglang-swa-p16"])
def test_recorded_sglang_streams_through_radixscope_watch(tmp_path, scenario) -> None:
    d = FIXTURES / scenario
    frames = [json.loads(line) for line in (d / "frames.jsonl").read_text().splitlines()]
    expected = json.loads((d / "expected.json").read_text())
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    replay = _ReplayServer(ctx, frames)  # the engine's replay socket, as SGLang has
    rep_port = replay.port
    store = tmp_path / "sglang.db"
    proc = subprocess.Popen([sys.executable, "-m", "radixscope.engine.cli", "watch",
                             f"tcp://127.0.0.1:{port}", "--replay", f"tcp://127.0.0.1:{rep_port}",
                             "--store", str(store)],
                            cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE,
                            text=True)

    def seen() -> dict:  # what the running watcher has committed to its store so far
        try:
            with telemetry.open_store(store) as r:
                return r.info().get("kv_events", {})
        except (ValueError, OSError):
            return {}

    def wait_for(cond, what: str) -> None:  # bounded: no sleep stands in for an event
        deadline = time.monotonic() + 60
        while not cond():
            assert proc.poll() is None and time.monotonic() < deadline, what
            time.sleep(0.05)

    try:
        # live frames a slow-joining subscriber misses come from the replay socket
        for f in frames:
            pub.send_multipart([base64.b64decode(f["topic"]), f["seq"].to_bytes(8, "big"),
                                base64.b64decode(f["payload"])])
        wait_for(lambda: seen().get("messages") == len(frames), "all frames ingested")
        # the subscription is up by now: garbage the watcher must count and skip
        pub.send_multipart([b"", (10**6).to_bytes(8, "big")])  # two frames
        wait_for(lambda: seen().get("counts", {}).get("bad_frames") == 1, "bad frame counted")
        proc.send_signal(__import__("signal").SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        replay.close()
        pub.close()
        ctx.term()
    assert proc.returncode == 0, err
    with telemetry.open_store(store) as r:
        got = r.blocks()
        info = r.info()
    assert info["kv_events"]["counts"]["bad_frames"] == 1
    assert info["kv_events"]["gaps"] == []
    assert str(got["hash"].dtype) == "Int64"
    for medium, blocks in expected["resident"].items():
        mine = got[got.medium == medium]
        assert sorted(int(h) for h in mine.hash) == [b["hash"] for b in blocks]
        by = {int(r.hash): r for r in mine.itertuples()}
        for b in blocks:
            row = by[b["hash"]]
            parent = None if row.parent_hash is __import__("pandas").NA else int(row.parent_hash)
            assert parent == b["parent_hash"] and list(row.token_ids) == b["token_ids"]
    assert info["kv_events"]["resident"] == expected["resident_counts"]


def test_doctor_on_a_watch_store_stopped_by_sigint(tmp_path, capsys) -> None:
    """``radixscope watch`` stopped by Ctrl-C closes its store the way a run's telemetry does,
    and ``radixscope doctor`` reads the external engine's store without false alarms: closed
    properly, pool sizes unknown (no capacity checks), the blocks still counted."""
    d = FIXTURES / "sglang-full-p1"
    frames = [json.loads(line) for line in (d / "frames.jsonl").read_text().splitlines()]
    expected = json.loads((d / "expected.json").read_text())
    ctx = zmq.Context()
    replay = _ReplayServer(ctx, frames)  # the stream is already sent: replay only
    rep_port = replay.port
    store = tmp_path / "watched.db"
    proc = subprocess.Popen([sys.executable, "-m", "radixscope.engine.cli", "watch",
                             f"tcp://127.0.0.1:{free_port()}", "--replay",
                             f"tcp://127.0.0.1:{rep_port}", "--store", str(store)],
                            cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE,
                            text=True)

    def messages() -> int | None:
        try:
            with telemetry.open_store(store) as r:
                return r.info().get("kv_events", {}).get("messages")
        except (ValueError, OSError):
            return None

    try:
        deadline = time.monotonic() + 60
        while messages() != len(frames):
            assert proc.poll() is None and time.monotonic() < deadline, "frames ingested"
            time.sleep(0.05)
        proc.send_signal(__import__("signal").SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        replay.close()
        ctx.term()
    assert proc.returncode == 0, err
    with telemetry.open_store(store) as r:
        closed, last_seq = r.info()["closed"], r.last_seq()
    assert closed["clean"] is True and closed["last_seq"] == last_seq
    assert main(["doctor", str(store)]) == 0
    lines = capsys.readouterr().out.splitlines()
    tokens = expected["resident_counts"]["GPU"] * expected["block_size"]
    assert lines[1].startswith("run: the store was closed properly (telemetry closed at ")
    assert lines[3:6] == [
        "  INFO pools: capacities unknown (an external engine's pool sizes are not published): "
        "the budget checks are skipped",
        "budget:",
        f"  full/device: capacity unknown; the tree holds {tokens} tokens here ({tokens} "
        "evictable, 0 protected)."]
    assert lines[-1] == "verdict: healthy"


@pytest.mark.parametrize("scenario", ["sglang-full-p1", "sglang-swa-p16"])
def test_a_watch_store_has_the_engines_page_size_at_every_seq(tmp_path, capsys,
                                                              scenario) -> None:
    """The block size is learned from the first ``BlockStored``, after the watcher wrote the
    empty tree's keyframe: the store still reports SGLang's page size (16 for FULL+SWA) at every
    seq, live (flushed every 5 messages) and closed, and ``radixscope doctor`` says so. SGLang
    publishes the FULL group's pages only, with no ``group_idx`` or spec kind: one component,
    ``full``, whose kind and window are recorded as not published."""
    d = FIXTURES / scenario
    frames = [json.loads(line) for line in (d / "frames.jsonl").read_text().splitlines()]
    page = json.loads((d / "expected.json").read_text())["block_size"]
    path = tmp_path / "w.db"
    w = Watcher(f"tcp://127.0.0.1:{free_port()}", path)
    for i, f in enumerate(frames):
        w._message([b"", f["seq"].to_bytes(8, "big"), base64.b64decode(f["payload"])])
        if i % 5 == 4:
            w._flush(live=True)
        if i == 9:  # a reader of the live store
            with telemetry.open_store(path) as r:
                assert r.state_at(r.last_seq()).page_size == page
    w.close()
    with telemetry.open_store(path) as r:
        last, info = r.last_seq(), r.info()
        assert list(r.keyframes().seq) == [0]  # learned before the first mutation
        for seq in (0, 1, last // 3, 2 * last // 3, last):
            snap = r.state_at(seq)
            assert (snap.page_size, snap.components) == (page, ("full",)), seq
    assert (info["cache"]["page_size"], info["cache"]["components"]) == (page, ["full"])
    assert info["kv_events"]["group_specs"] == [{"kind": None, "sliding_window": None}]
    assert main(["doctor", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"store {path}: full cache, page size {page}, journal up to seq {last}")


def test_a_group_appearing_mid_stream_restarts_the_journal_where_it_appeared(tmp_path) -> None:
    """vLLM-shaped events with ``group_idx`` and spec kinds, block size 4: group 0 (2 blocks, 4
    mutations), then group 1 (sliding window 64) in the same message, then one more block. The
    block size holds from seq 0, the second group from seq 4 (where it was learned), and every
    seq rebuilds, also those between the group's appearance and the next flush."""
    def stored(hashes, parent, first, group, kind, window=None):
        return wire.BlockStored(hashes, parent, list(range(first, first + 4 * len(hashes))), 4,
                                None, "GPU", None, group_idx=group, kv_cache_spec_kind=kind,
                                kv_cache_spec_sliding_window=window)

    batches = [[wire.AllBlocksCleared()],
               [stored([11, 12], None, 0, 0, "full_attention"),
                stored([11, 12], None, 0, 1, "sliding_window", 64)],
               [stored([13], 12, 8, 0, "full_attention")]]
    path = tmp_path / "groups.db"
    w = Watcher(f"tcp://127.0.0.1:{free_port()}", path)
    for seq, events in enumerate(batches):
        w._message([b"", seq.to_bytes(8, "big"),
                    wire.encode_batch(wire.KVEventBatch(float(seq), events))])
    w.close()
    with telemetry.open_store(path) as r:
        assert list(r.keyframes().seq) == [0, 4]
        shapes = [(r.state_at(s).page_size, r.state_at(s).components, len(r.state_at(s).nodes))
                  for s in range(r.last_seq() + 1)]
        info = r.info()
    one, two = ("full",), ("full", "swa")
    assert shapes == [(4, one, 1), (4, one, 2), (4, one, 2), (4, one, 3), (4, two, 3),
                      (4, two, 3), (4, two, 3), (4, two, 4), (4, two, 4)]
    assert info["cache"]["components"] == list(two)
    assert info["kv_events"]["group_specs"] == [
        {"kind": "full_attention", "sliding_window": None},
        {"kind": "sliding_window", "sliding_window": 64}]


class ConsumerProcess:
    """``kvevents_consumer.py`` in its own process; its stdout lines arrive on a queue, so every
    wait for one is bounded (``queue.get(timeout=...)``)."""

    def __init__(self, endpoint: str, replay: str, out: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CONSUMER), endpoint, str(out), "120",
                                      replay], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.lines: queue.Queue[str] = queue.Queue()
        self.live = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith("live"):
                self.live.set()
            self.lines.put(line.strip())
        self.lines.put("eof")

    def expect(self, word: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line.split()[0] == word:
                return line
            assert line != "eof", f"consumer exited before {word!r}"

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def test_vllm_shaped_consumer_in_another_process(tmp_path, monkeypatch) -> None:
    """The consumer subscribes and says ``ready``; the engine steps on while it waits (at most
    0.5 s a step) for the consumer's first live message; before the run's telemetry closes,
    the consumer is told the last seq and fills from replay whatever it missed."""
    import radixscope.engine.run as run_mod
    port, rep = free_port(), free_port()
    out = tmp_path / "consumer.json"
    consumer = ConsumerProcess(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rep}", out)
    try:
        consumer.expect("ready", 60)
        real_open = run_mod._open_telemetry
        ended: list[int] = []

        def open_with_end(path, mode):
            tel = real_open(path, mode)
            publisher = tel.pipeline.transport.sink.named["kv_events"]
            real_close = tel.close

            def close(timeout_s: float = 30.0) -> dict:
                tel.flush()  # every batch handled: publisher.seq is the last seq + 1
                ended.append(publisher.seq)
                consumer.send(f"end {publisher.seq}")
                consumer.expect("done", 60)
                return real_close(timeout_s)
            tel.close = close
            return tel

        monkeypatch.setattr(run_mod, "_open_telemetry", open_with_end)
        tels: list = []
        real_capture = run_mod._open_telemetry

        def capture(path, mode):
            tels.append(real_capture(path, mode))
            return tels[-1]

        monkeypatch.setattr(run_mod, "_open_telemetry", capture)
        step = [0]

        def hook(_engine) -> None:
            step[0] += 1
            if step[0] % 2 == 0:
                tels[0].flush()
                if not consumer.live.is_set():
                    consumer.live.wait(0.5)  # bounded: throttles the run, never a condition

        monkeypatch.setenv("RADIXSCOPE_KV_EVENTS", f"tcp://127.0.0.1:{port}")
        monkeypatch.setenv("RADIXSCOPE_KV_EVENTS_REPLAY", f"tcp://127.0.0.1:{rep}")
        spec = RunSpec(workload="chat", requests=40, seed=3, components=("full", "swa"),
                       sizes={"device_tokens": 512, "host_tokens": 2048,
                              "swa_device_tokens": 384, "swa_host_tokens": 2048},
                       store=str(tmp_path / "own.db"), telemetry_mode="inline")
        result = execute(spec, on_step=hook)
        assert result.error is None
        consumer.proc.wait(timeout=30)
    finally:
        consumer.stop()
    report = json.loads(out.read_text())
    assert report["errors"] == [], report["errors"][:5]
    assert report["end"] == ended[0] and report["last_seq"] == ended[0] - 1
    assert report["messages"] == ended[0] > 3
    assert report["live"] >= 1 and report["live"] + report["replayed"] == report["messages"]
    assert report["stored"] > 0 and report["removed"] > 0
    assert set(report["media"]) == {"GPU", "CPU"} and set(report["groups"]) == {0, 1}


@pytest.mark.parametrize("payload", [
    b"\xc1garbage", b"", b"\x93\xcb\x00", wire.encode_batch(wire.KVEventBatch(1.0, [])) + b"x",
])
def test_decode_rejects_bad_payloads(payload) -> None:
    with pytest.raises(wire.BadFrame):
        wire.decode_batch(payload)


def test_array_events_unknown_types_and_block_size_change() -> None:
    import msgspec

    from radixscope.telemetry.kvevents.ingest import EngineTree
    old = msgspec.msgpack.encode([1.0, [["BlockStored", [5, 6], None, [1, 2, 3, 4], 2, None,
                                         "CPU_PINNED"], ["Mystery", 1],
                                        {"type": "BlockStored", "block_hashes": [7],
                                         "parent_block_hash": 6, "token_ids": [1, 2, 3],
                                         "block_size": 3, "lora_id": None, "medium": "GPU"},
                                        ["BlockRemoved", [5], "CPU_PINNED"]]])
    t = EngineTree()
    t.apply(wire.decode_batch(old), 0)
    assert t.counts["unknown_events"] == 1 and t.counts["bad_block_size"] == 1
    assert {k: sorted(v) for k, v in t.resident.items()} == {("CPU_PINNED", 0): [6]}


class _ReplayServer:
    """An engine's replay ROUTER socket on 127.0.0.1 (a free port: ``port``) serving ``frames``
    from a thread (``_serve_replay_only``) until ``close``."""

    def __init__(self, ctx: zmq.Context, frames: list[dict]) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.port = free_port()
        self.router.bind(f"tcp://127.0.0.1:{self.port}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_serve_replay_only,
                                        args=(self.router, frames, self._stop), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.router.close()


def _serve_replay_only(router: zmq.Socket, frames: list[dict], stop: threading.Event) -> None:
    """An engine whose PUB socket sent everything before the watcher joined: only its replay
    ROUTER socket still has the stream (SGLang's reply shape, topic frame included)."""
    while not stop.is_set():
        if not router.poll(50):
            continue
        ident, _, start = router.recv_multipart()
        first = int.from_bytes(start, "big")
        for f in frames:
            if f["seq"] >= first:
                router.send_multipart([ident, b"", base64.b64decode(f["topic"]),
                                       f["seq"].to_bytes(8, "big"),
                                       base64.b64decode(f["payload"])])
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])


def test_a_watcher_joining_after_the_stream_catches_up_from_replay(tmp_path) -> None:
    """No live message ever arrives (a subscriber that joined late, or a lost tail): a quiet
    watcher asks the replay socket and rebuilds exactly the engine's resident blocks."""
    d = FIXTURES / "sglang-full-p1"
    frames = [json.loads(line) for line in (d / "frames.jsonl").read_text().splitlines()]
    expected = json.loads((d / "expected.json").read_text())
    pub_port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    replay = _ReplayServer(ctx, frames)
    try:
        watcher = WatchThread(f"tcp://127.0.0.1:{pub_port}", tmp_path / "late.db",
                              f"tcp://127.0.0.1:{replay.port}")
        watcher.stop_after(len(frames), timeout_s=30)
    finally:
        replay.close()
        pub.close()
        ctx.term()
    counts = watcher.w.tree.counts
    assert watcher.w.messages == len(frames) == counts["replayed"]
    assert watcher.w.gaps == []
    with telemetry.open_store(tmp_path / "late.db") as r:
        got = r.blocks()
    assert sorted(int(h) for h in got.hash) == [b["hash"] for b in expected["resident"]["GPU"]]


def test_a_seq_jump_of_two_to_the_62_is_one_gap_in_bounded_time(tmp_path) -> None:
    """A sender's seq is untrusted: a jump far ahead records one gap (work per message, not
    per missing seq), and a negative seq is a bad frame."""
    d = FIXTURES / "sglang-full-p1"
    frame = json.loads((d / "frames.jsonl").read_text().splitlines()[0])
    w = Watcher(f"tcp://127.0.0.1:{free_port()}", tmp_path / "jump.db")
    payload = base64.b64decode(frame["payload"])
    t0 = time.monotonic()
    w._message([b"", (0).to_bytes(8, "big"), payload])
    w._message([b"", (1 << 62).to_bytes(8, "big"), payload])
    w._message([b"", (-5).to_bytes(8, "big", signed=True), payload])
    assert time.monotonic() - t0 < 5
    assert w.gaps == [[1, (1 << 62) - 1]]
    assert w.tree.counts["missed_messages"] == (1 << 62) - 1
    assert w.tree.counts["bad_frames"] == 1
    w.close()


def test_blocks_of_a_tampered_watcher_store_is_one_error_naming_the_file(tmp_path) -> None:
    import sqlite3

    d = FIXTURES / "sglang-full-p1"
    frame = json.loads((d / "frames.jsonl").read_text().splitlines()[0])
    path = tmp_path / "w.db"
    w = Watcher(f"tcp://127.0.0.1:{free_port()}", path)
    w._message([b"", (0).to_bytes(8, "big"), base64.b64decode(frame["payload"])])
    w.close()
    for sql in ("UPDATE info SET value = '[1]' WHERE key = 'kv_events'",
                "UPDATE kv_blocks SET hash = 'zz'"):
        bad = tmp_path / "bad.db"
        bad.write_bytes(path.read_bytes())
        con = sqlite3.connect(bad)
        con.execute(sql)
        con.commit()
        con.close()
        with telemetry.open_store(bad) as r, pytest.raises(ValueError, match="bad.db"):
            r.blocks()


def _ask_replay(dealer: zmq.Socket, start: int) -> list[int]:
    """One replay request; the seqs of the messages before the end marker (bounded wait)."""
    dealer.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
    seqs = []
    while dealer.poll(5000):
        _, _topic, seq_b, _payload = dealer.recv_multipart()
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq == -1:
            return seqs
        seqs.append(seq)
    raise TimeoutError(f"replay from {start}: no end marker within 5 s")


def test_the_replay_socket_limits_each_client_and_refuses_a_negative_start(tmp_path) -> None:
    """A client asking in a loop gets its burst, then end markers only (counted); another
    client is served meanwhile; a negative start seq is a bad request (end marker only)."""
    rep = free_port()
    tel = telemetry.setup(store=None, mode="inline", capture_host_spans=False, kv_events={
        "endpoint": f"tcp://127.0.0.1:{free_port()}", "replay_endpoint": f"tcp://127.0.0.1:{rep}",
        "replay_per_s": 0.01, "replay_burst": 3})
    cache = HiRadixCache(make_config(), recorder=tel.recorder)
    d = Driver(cache)
    for i in range(4):
        d.insert([10 * i + j for j in range(1, 9)])
    tel.flush()
    ctx = zmq.Context()
    greedy, other = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        for s in (greedy, other):
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://127.0.0.1:{rep}")
        answers = [_ask_replay(greedy, 0) for _ in range(8)]
        assert all(answers[:3]) and answers[0] == sorted(answers[0])
        assert answers[3:] == [[]] * 5  # beyond the burst: end markers only
        assert _ask_replay(other, 0) == answers[0]  # a second client has its own bucket
        assert _ask_replay(other, -1) == []
    finally:
        greedy.close()
        other.close()
        ctx.term()
    stats = tel.close()
    assert stats["notes"]["kv_events.replay_rate_limited"] == 5
    assert stats["notes"]["kv_events.bad_replay_requests"] == 1


@pytest.mark.parametrize("bad", [{"replay_per_s": 0}, {"replay_per_s": float("inf")},
                                 {"replay_per_s": True}, {"replay_burst": 0},
                                 {"replay_burst": 2.5}])
def test_replay_limits_are_validated_naming_the_value(bad) -> None:
    from radixscope.telemetry.kvevents.config import KvEventsConfig
    name, value = next(iter(bad.items()))
    with pytest.raises(ValueError, match=f"{name}={value!r}"):
        KvEventsConfig("tcp://127.0.0.1:5557", **bad)


def test_a_checked_endpoint_is_free_the_moment_the_check_returns() -> None:
    """``setup`` checks the publisher's endpoints (``check_endpoints``) and the publisher binds
    them right after. ZMQ closes a listener on its I/O thread after ``close`` returns, so the
    check once left the port taken for that bind: CI failed with 'Address already in use' on a
    publisher's port, and a plain bind (``SO_REUSEADDR``, as ZMQ binds) right after the old
    check failed in 1,148 of 3,000 tries."""
    for _ in range(1000):
        port = free_port()
        assert try_endpoint(f"tcp://127.0.0.1:{port}", zmq.PUB) is None
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))  # raises while the check's listener is still open
