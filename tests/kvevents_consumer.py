"""A KV-event consumer in its own process with strict, tagged msgspec structs shaped like
vLLM's current ``vllm/distributed/kv_events.py``. Checks: seq increases by one, every removed
hash was stored, every parent was stored, ``len(token_ids) == block_size * len(block_hashes)``.

    python tests/kvevents_consumer.py ENDPOINT REPORT.json SECONDS REPLAY_ENDPOINT
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


def fetch_replay(ctx: zmq.Context, endpoint: str, start: int, until: int) -> list:
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    d.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while d.poll(5000):
        _, _topic, seq_b, payload = d.recv_multipart()
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq == -1:
            break
        if seq < until:
            out.append((seq, payload))
    d.close()
    return out


def main() -> None:
    endpoint, out, seconds, replay = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.5)
    open(out + ".ready", "w").close()
    dec = msgspec.msgpack.Decoder(KVEventBatch)
    st = State()
    end = time.monotonic() + seconds
    idle_end = None
    while time.monotonic() < end:
        if not sub.poll(200):
            if st.n and idle_end is None:
                idle_end = time.monotonic() + 2.0
            if idle_end is not None and time.monotonic() > idle_end:
                break
            continue
        idle_end = None
        _topic, seq_b, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_b, "big")
        if st.last is None and seq > 0:  # joined after the publisher bound: replay the start
            for s_, p_ in fetch_replay(ctx, replay, 0, seq):
                st.check(s_, dec.decode(p_))
        st.check(seq, dec.decode(payload))
    json.dump({"messages": st.n, "errors": st.errors, "stored": st.n_stored,
               "removed": st.n_removed, "media": sorted(st.media),
               "groups": sorted(st.groups)}, open(out, "w"))
    sub.close()
    ctx.term()


if __name__ == "__main__":
    main()
