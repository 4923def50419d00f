"""A KV-event consumer in its own process with strict, tagged msgspec structs shaped like
vLLM's current ``vllm/distributed/kv_events.py``. Checks: seq increases by one, every removed
hash was stored, every parent was stored, ``len(token_ids) == block_size * len(block_hashes)``.

    python tests/kits/kvevents_consumer.py ENDPOINT REPORT.json SECONDS REPLAY_ENDPOINT

It joins the way a real consumer does: it subscribes, and whatever it missed (the start of the
stream before its subscription reached the PUB socket, a gap, the tail) it takes from the
replay socket, so no message is lost to the slow-joiner race.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import msgspec
import zmq


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True,
                   forbid_unknown_fields=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


class State:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.stored: set[int] = set()
        self.last: int | None = None
        self.n = self.n_stored = self.n_removed = 0
        self.media: set = set()
        self.groups: set = set()

    def check(self, seq: int, batch: KVEventBatch) -> None:
        if (self.last is None and seq != 0) or (self.last is not None and seq != self.last + 1):
            self.errors.append(f"seq {seq} after {self.last}")
        self.last = seq
        self.n += 1
        for e in batch.events:
            if isinstance(e, BlockStored):
                if len(e.token_ids) != e.block_size * len(e.block_hashes):
                    self.errors.append(f"seq {seq}: token_ids/block_size mismatch")
                parent = e.parent_block_hash
                for h in e.block_hashes:
                    if parent is not None and parent not in self.stored:
                        self.errors.append(f"seq {seq}: parent {parent} never stored")
                    self.stored.add(h)
                    parent = h
                self.n_stored += len(e.block_hashes)
                self.media.add(e.medium)
                self.groups.add(e.group_idx)
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    if h not in self.stored:
                        self.errors.append(f"seq {seq}: removed {h} never stored")
                self.n_removed += len(e.block_hashes)


def fetch_replay(dealer: zmq.Socket, start: int, until: int, timeout_ms: int) -> list:
    """Messages ``start <= seq < until`` from the replay socket (request ``[b"", start]``)."""
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while dealer.poll(timeout_ms):
        _, _topic, seq_b, payload = dealer.recv_multipart()
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq == -1:
            return out
        if start <= seq < until:
            out.append((seq, payload))
    raise TimeoutError(f"replay from {start}: no end marker within {timeout_ms} ms")


class Consumer:
    """Live messages from SUB; what it missed (the start, a gap, the tail) from replay."""

    def __init__(self, endpoint: str, replay: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(replay)
        self.dec = msgspec.msgpack.Decoder(KVEventBatch)
        self.st = State()
        self.live = self.replayed = 0

    def fill(self, until: int, timeout_ms: int) -> None:
        start = 0 if self.st.last is None else self.st.last + 1
        if start < until:
            for s, p in fetch_replay(self.dealer, start, until, timeout_ms):
                self.replayed += 1
                self.st.check(s, self.dec.decode(p))

    def on_live(self, seq: int, payload: bytes, timeout_ms: int) -> None:
        if self.st.last is not None and seq <= self.st.last:
            return  # already had it from replay
        self.fill(seq, timeout_ms)
        self.live += 1
        self.st.check(seq, self.dec.decode(payload))

    def report(self) -> dict:
        st = self.st
        return {"messages": st.n, "live": self.live, "replayed": self.replayed,
                "last_seq": st.last, "errors": st.errors, "stored": st.n_stored,
                "removed": st.n_removed, "media": sorted(m for m in st.media if m),
                "groups": sorted(g for g in st.groups if g is not None)}

    def close(self) -> None:
        self.sub.close()
        self.dealer.close()
        self.ctx.term()


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    """Protocol on stdio: prints ``ready`` once connected, ``live SEQ`` at its first live
    message; reads ``end N`` (the publisher has sent seqs ``0..N-1`` and is still open), fills
    what it lacks from replay, writes the report, prints ``done``. Every wait is bounded."""
    endpoint, out, seconds, replay = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    c = Consumer(endpoint, replay)
    poller = zmq.Poller()
    poller.register(c.sub, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    say("ready")
    deadline = time.monotonic() + seconds
    end: int | None = None
    try:
        while end is None and time.monotonic() < deadline:
            events = dict(poller.poll(200))
            while c.sub in events and c.sub.poll(0):
                _topic, seq_b, payload = c.sub.recv_multipart()
                first = c.live == 0
                c.on_live(int.from_bytes(seq_b, "big"), payload, 10_000)
                if first:
                    say(f"live {c.st.last}")
            if sys.stdin.fileno() in events:
                line = sys.stdin.readline().split()
                if not line:
                    break  # the test went away
                if line[0] == "end":
                    end = int(line[1])
        while c.sub.poll(0):  # anything live still queued
            _topic, seq_b, payload = c.sub.recv_multipart()
            c.on_live(int.from_bytes(seq_b, "big"), payload, 10_000)
        if end is not None:
            c.fill(end, 10_000)
        rep = c.report()
        rep["end"] = end
    except Exception as e:  # noqa: BLE001 - reported to the test, not raised past it
        rep = {**c.report(), "end": end, "errors": [*c.st.errors, f"{type(e).__name__}: {e}"]}
    with open(out, "w") as f:
        json.dump(rep, f)
    c.close()
    say("done")


if __name__ == "__main__":
    main()
