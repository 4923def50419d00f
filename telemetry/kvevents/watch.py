"""``radixscope watch``: subscribe to an engine's KV events and write its tree to a store.

A SUB socket (connects to the engine's PUB endpoint) receives ``[topic, seq, payload]``. Each
message is checked (frame count, an 8-byte seq, the payload a KV-event batch); a bad one is
counted (``info["kv_events"]["counts"]``) and skipped. A seq jump asks the replay endpoint
(a DEALER sending ``[b"", start_seq]``; replies ``[b"", topic, seq, payload]`` or the older
``[b"", seq, payload]``, ended by seq -1) for the missing messages; what replay cannot give
is recorded as a gap (``info["kv_events"]["gaps"]`` and an event row). The tree goes into the
store as a journal (see ``ingest.py``), the blocks into ``kv_blocks`` (stored / removed seq
and time: lifetimes), and the residency per medium into ``info["kv_events"]`` with store /
remove rates. ``info["engine"]`` labels it an external engine (``live`` until the watcher
stops). Runs until ``stop()`` (SIGINT / SIGTERM in the CLI), then closes the store completely,
with the ``info["closed"]`` record a run's telemetry writes (``telemetry.store.runstate``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import zmq

from radixscope.telemetry.kvevents import wire
from radixscope.telemetry.kvevents.ingest import BlockChange, EngineTree
from radixscope.telemetry.store.schema import create_store, resolve_new_store
from radixscope.telemetry.store.writer import StoreWriter

MAX_FRAME_BYTES = 64 << 20
REPLAY_TIMEOUT_S = 2.0
MAX_REPLAY_MESSAGES = 100_000  # kept from one replay reply at most
IDLE_REPLAY_S = 1.0  # quiet this long with a replay socket: ask it for anything missed


def to_i64(h: int | None) -> int | None:
    """A 64-bit hash as SQLite's signed INTEGER (two's complement); ``from_i64`` undoes it."""
    return None if h is None else (h - (1 << 64) if h >= 1 << 63 else h)


class Watcher:
    """Watches one engine.

    Args:
        endpoint: the engine's PUB endpoint (the watcher connects).
        store: a new store file.
        replay: the engine's replay endpoint, or None (gaps are only recorded).
        topic: topic prefix to subscribe to ("" = all).
        overwrite: replace an existing store.
        commit_every_s: how often the store is committed (readers see the tree this late).
    """

    def __init__(self, endpoint: str, store: str | Path, replay: str | None = None,
                 topic: str = "", overwrite: bool = False, commit_every_s: float = 0.2) -> None:
        self.endpoint, self.replay, self.topic = endpoint, replay, topic
        path = resolve_new_store(store, overwrite)
        create_store(path, {"mode": "watch", "endpoint": endpoint, "replay": replay,
                            "topic": topic}, overwrite=overwrite)
        self.path = path
        self.store = StoreWriter(path)
        self.tree = EngineTree()
        self.expected: int | None = None
        self.gaps: list[list[int]] = []
        self.messages = 0
        self.commit_every_s = commit_every_s
        self._stop = threading.Event()
        self._started_ns = time.time_ns()
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(endpoint)
        self.unsigned_hashes = False
        self._flush(live=True)  # the empty tree's keyframe: every seq from 0 can be rebuilt
        # (page size and groups are rewritten as the events reveal them: ``EngineTree.take``)

    def stop(self) -> None:
        """Ask ``run`` to return (thread- and signal-safe)."""
        self._stop.set()

    def run(self, max_s: float | None = None) -> dict:
        """Receive until stopped (or ``max_s``), then close the store. Returns the counts."""
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        end = None if max_s is None else time.monotonic() + max_s
        last_commit = last_rx = time.monotonic()
        clean = False
        try:
            while not self._stop.is_set() and (end is None or time.monotonic() < end):
                if poller.poll(50):
                    last_rx = time.monotonic()
                    for _ in range(1000):
                        try:
                            frames = self._sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._message(frames)
                elif self.replay and time.monotonic() - last_rx >= IDLE_REPLAY_S:
                    # a PUB socket drops what a subscriber joining late (or a lost tail)
                    # never sees, and no later message reveals it: ask the replay socket
                    self._catch_up()
                    last_rx = time.monotonic()
                if time.monotonic() - last_commit >= self.commit_every_s:
                    self._flush(live=True)
                    last_commit = time.monotonic()
            clean = True
        finally:
            self.close(clean=clean)
        return dict(self.tree.counts)

    def close(self, clean: bool = True) -> None:
        """Flush the tree, record ``info["closed"]`` as a run's telemetry does (``clean``
        false: the watcher stopped on an error) and close the store. Idempotent."""
        if self.store.con is None:
            return
        self._sub.close()
        self._ctx.term()
        self.store.set_info("closed", {
            "clean": bool(clean), "ts_ns": time.time_ns(), "last_seq": self.tree.seq,
            "reason": None if clean else "the watcher stopped on an error"})
        self._flush(live=False)
        self.store.close()

    # ---- messages -----------------------------------------------------------------------------
    def _message(self, frames: list[bytes]) -> None:
        counts = self.tree.counts
        if len(frames) != 3 or len(frames[1]) != 8:
            counts["bad_frames"] += 1
            return
        seq = int.from_bytes(frames[1], "big", signed=True)  # as replay replies decode it
        if seq < 0:
            counts["bad_frames"] += 1
            return
        if self.expected is not None and seq < self.expected:
            counts["duplicate_or_restart"] += 1
            if seq != 0:
                return
            self.expected = None  # the engine restarted its sequence
        if self.expected is not None and seq > self.expected:
            self._fill(self.expected, seq)
        elif self.expected is None and self.messages == 0 and seq > 0 and self.replay:
            self._fill(0, seq)  # joined late: what the engine still buffers comes first
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = wire.decode_batch(payload)
        except wire.BadFrame:
            self.tree.counts["bad_frames"] += 1
        else:
            self.tree.apply(batch, time.time_ns())
        self.messages += 1
        self.expected = seq + 1

    def _fill(self, start: int, until: int) -> None:
        """Fetch ``start .. until-1`` from the replay socket; record what is still missing."""
        got = self._request_replay(start, until) if self.replay else {}
        self._apply_replayed(start, got, until)

    def _catch_up(self) -> None:
        """Apply whatever the replay socket holds past the last seq seen (none seen: from 0)."""
        start = self.expected if self.expected is not None else 0
        self._apply_replayed(start, self._request_replay(start, 1 << 62), None)

    def _apply_replayed(self, start: int, got: dict[int, bytes], until: int | None) -> None:
        """Apply replayed messages in seq order; each run of seqs neither seen nor replayed
        (from ``start``, up to ``until`` when given) is one gap: the work is per message
        received, never per missing seq (a sender can jump its seq by 2**62)."""
        cur = start
        for s in sorted(got):
            if s > cur:
                self._missed(cur, s - 1)
            self._apply(s, got[s])
            self.tree.counts["replayed"] += 1
            cur = s + 1
        if until is not None and cur < until:
            self._missed(cur, until - 1)
        self._gap_event(start)

    def _missed(self, first: int, last: int) -> None:
        """Seqs ``first..last`` will never arrive: one gap (merged with an adjacent one)."""
        if self.gaps and self.gaps[-1][1] == first - 1:
            self.gaps[-1][1] = last
        else:
            self.gaps.append([first, last])
        self.tree.counts["missed_messages"] += last - first + 1

    def _gap_event(self, start: int) -> None:
        if self.gaps and self.gaps[-1][1] >= start:
            g = self.gaps[-1]
            self.store.write_event(time.time_ns(), self.tree.seq, "kv_events.gap",
                                   {"first_seq": g[0], "last_seq": g[1]})

    def _request_replay(self, start: int, until: int) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        try:
            dealer.connect(self.replay)
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while time.monotonic() < deadline:
                if not dealer.poll(int(max(1, (deadline - time.monotonic()) * 1000))):
                    break
                fr = dealer.recv_multipart()
                if len(fr) == 4:  # [b"", topic, seq, payload]
                    seq_b, payload = fr[2], fr[3]
                elif len(fr) == 3:  # older vLLM: [b"", seq, payload]
                    seq_b, payload = fr[1], fr[2]
                else:
                    self.tree.counts["bad_replay_frames"] += 1
                    continue
                if len(seq_b) != 8:
                    self.tree.counts["bad_replay_frames"] += 1
                    continue
                s = int.from_bytes(seq_b, "big", signed=True)
                if s == -1:
                    break
                if start <= s < until:
                    out[s] = payload
                    if len(out) >= MAX_REPLAY_MESSAGES:  # a reply that never ends
                        self.tree.counts["replay_truncated"] += 1
                        break
        except zmq.ZMQError:
            self.tree.counts["replay_errors"] += 1
        finally:
            dealer.close()
        return out

    # ---- the store ----------------------------------------------------------------------------
    def _flush(self, live: bool) -> None:
        muts, changes, keyframes = self.tree.take()
        st = self.store
        for kf in keyframes:
            # the empty tree, or the block size / groups became known at ``base``: the journal
            # restarts there from a keyframe of that shape (one at the same seq is replaced)
            base = kf["seq"]
            st.write_mutations([m for m in muts if m[0] <= base])
            st.write_keyframe(base, kf)
            st.set_info("cache", {"config": {"page_size": kf["page_size"]},
                                  "components": kf["components"],
                                  "page_size": kf["page_size"], "pools": {},
                                  "bytes_per_slot": {}, "external": True})
            muts = [m for m in muts if m[0] > base]
        if muts:
            st.write_mutations(muts)
        if changes:
            self._write_changes(changes)
        self._write_info(live)
        st.commit()

    def _write_changes(self, changes: list[BlockChange]) -> None:
        con = self.store._tx()  # noqa: SLF001
        for c in changes:
            if c.hash >= 1 << 63 or (c.parent or 0) >= 1 << 63:
                self.unsigned_hashes = True
            if c.removed:
                con.execute("UPDATE kv_blocks SET removed_seq = ?, removed_ns = ? WHERE medium = ?"
                            " AND grp = ? AND hash = ? AND removed_seq IS NULL",
                            (c.seq, c.ts_ns, c.medium, c.group, to_i64(c.hash)))
            else:
                con.execute("INSERT INTO kv_blocks VALUES (?, ?, ?, ?, ?, ?, NULL, ?, NULL)",
                            (c.medium, c.group, to_i64(c.hash), to_i64(c.parent),
                             json.dumps(list(c.tokens)), c.seq, c.ts_ns))

    def _write_info(self, live: bool) -> None:
        t = self.tree
        elapsed = max(1e-9, (time.time_ns() - self._started_ns) / 1e9)
        self.store.set_info("engine", {"external": True, "source": "kv-events",
                                       "endpoint": self.endpoint, "replay": self.replay,
                                       "topic": self.topic, "live": live})
        self.store.set_info("kv_events", {
            "messages": self.messages, "next_seq": self.expected, "gaps": self.gaps,
            "block_size": t.block_size, "groups": t.components,
            "group_specs": [{"kind": k, "sliding_window": w} for k, w in t.group_specs],
            "hash_unsigned": self.unsigned_hashes,
            "resident": t.resident_counts(), "counts": dict(t.counts),
            "rates_per_s": {"stored_blocks": t.counts["stored_blocks"] / elapsed,
                            "removed_blocks": t.counts["removed_blocks"] / elapsed}})
        self.store.set_info("last_seq", t.seq)
