"""A KV-event consumer in its own process with strict, tagged msgspec structs shaped like
vLLM's current ``vllm/distributed/kv_events.py``. Checks: seq increases by one, every removed
hash was stored, every parent was stored, ``len(token_ids) == block_size * len(block_hashes)``.

    python tests/kvevents_consumer.py ENDPOINT REPORT.json SECONDS
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


def main() -> None:
    endpoint, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    dec = msgspec.msgpack.Decoder(KVEventBatch)
    errors: list[str] = []
    stored: set[int] = set()
    last = None
    n = n_stored = n_removed = 0
    media: set[str] = set()
    groups: set[int] = set()
    end = time.monotonic() + seconds
    idle_end = None
    while time.monotonic() < end:
        if not sub.poll(200):
            if n and idle_end is None:
                idle_end = time.monotonic() + 2.0
            if idle_end is not None and time.monotonic() > idle_end:
                break
            continue
        idle_end = None
        topic, seq_b, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_b, "big")
        if last is not None and seq != last + 1:
            errors.append(f"seq {seq} after {last}")
        last = seq
        n += 1
        batch = dec.decode(payload)
        for e in batch.events:
            if isinstance(e, BlockStored):
                if len(e.token_ids) != e.block_size * len(e.block_hashes):
                    errors.append(f"seq {seq}: token_ids/block_size mismatch")
                parent = e.parent_block_hash
                for h in e.block_hashes:
                    if parent is not None and parent not in stored:
                        errors.append(f"seq {seq}: parent {parent} never stored")
                    stored.add(h)
                    parent = h
                n_stored += len(e.block_hashes)
                media.add(e.medium)
                groups.add(e.group_idx)
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    if h not in stored:
                        errors.append(f"seq {seq}: removed {h} never stored")
                n_removed += len(e.block_hashes)
    json.dump({"messages": n, "errors": errors, "stored": n_stored, "removed": n_removed,
               "media": sorted(media), "groups": sorted(groups)}, open(out, "w"))
    sub.close()
    ctx.term()


if __name__ == "__main__":
    main()
