"""The KV-event wire format, both directions.

Encoding (our publisher): msgspec structs shaped like vLLM's current ``vllm/distributed/
kv_events.py`` (events are maps tagged by ``"type"``; the batch is ``[ts, events, dp_rank]``).
Unlike vLLM we keep every field on the wire (``omit_defaults=False``): ``lora_id``, ``medium``,
``lora_name`` and the optional fields appear as nil when unused, so a consumer with vLLM's
strict structs, SGLang's, or an array-tolerant one (llm-d, Dynamo) accepts the frames.

Decoding (the watcher): ``decode_batch`` turns an untrusted payload into plain ``Stored`` /
``Removed`` / ``Cleared`` tuples. It accepts the batch as an array or a map, each event as a
tagged map or as the older positional array (``["BlockStored", hashes, parent, tokens, size,
lora_id, medium, ...]``), hashes as ints (signed or unsigned 64-bit) or bytes. Anything else
raises ``BadFrame``; an event of an unknown type is reported, not fatal.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MAX_PAYLOAD = 64 << 20  # bytes: a bigger frame is refused before decoding
MAX_EVENTS = 1 << 20
MAX_TOKENS = 1 << 24
MASK64 = (1 << 64) - 1


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=False, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=False, gc=False, tag=True):
    """Base of the events: a map with ``"type": <class name>``."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def seq_bytes(seq: int) -> bytes:
    """A seq frame: 8 bytes big-endian, signed (the replay end marker is -1)."""
    return int(seq).to_bytes(8, "big", signed=True)


# ---- decoding (untrusted input) -----------------------------------------------------------
class BadFrame(ValueError):
    """A payload or frame that is not a KV-event batch (its reason in the message)."""


class Stored(NamedTuple):
    hashes: tuple[int, ...]
    parent: int | None
    tokens: tuple[int, ...]
    block_size: int
    medium: str
    group: int
    kind: str | None
    window: int | None


class Removed(NamedTuple):
    hashes: tuple[int, ...]
    medium: str
    group: int | None  # None: every group of that medium


class Cleared(NamedTuple):
    pass


class Decoded(NamedTuple):
    ts: float
    events: list[Stored | Removed | Cleared]
    unknown: int  # events of a type this version does not know (skipped)
    dp_rank: int | None


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                  "kv_cache_spec_sliding_window")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_DECODER = msgspec.msgpack.Decoder()


def decode_batch(payload: bytes) -> Decoded:
    """Decode one payload into normalized events (raises ``BadFrame``)."""
    if not isinstance(payload, bytes | bytearray | memoryview) or len(payload) > MAX_PAYLOAD:
        raise BadFrame("payload is not bytes or is too large")
    try:
        raw = _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as e:
        raise BadFrame(f"not msgpack: {e}") from None
    if isinstance(raw, dict):
        ts, events, dp = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) in (2, 3):
        ts, events, dp = raw[0], raw[1], raw[2] if len(raw) == 3 else None
    else:
        raise BadFrame("batch is neither [ts, events, dp_rank] nor a map")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise BadFrame("batch ts / events have the wrong type")
    if len(events) > MAX_EVENTS:
        raise BadFrame(f"{len(events)} events in one batch")
    out: list[Stored | Removed | Cleared] = []
    unknown = 0
    for e in events:
        ev = _event(e)
        if ev is None:
            unknown += 1
        else:
            out.append(ev)
    return Decoded(float(ts), out, unknown, dp if isinstance(dp, int) else None)


def _fields(e: Any, names: tuple[str, ...]) -> tuple[str, dict]:
    if isinstance(e, dict):
        return str(e.get("type")), e
    if isinstance(e, list) and e and isinstance(e[0], str):
        return e[0], dict(zip(names, e[1:], strict=False))
    raise BadFrame("event is neither a tagged map nor a tagged array")


def _event(e: Any) -> Stored | Removed | Cleared | None:
    kind = e.get("type") if isinstance(e, dict) else (e[0] if isinstance(e, list) and e else None)
    if kind == "BlockStored":
        f = _fields(e, _STORED_FIELDS)[1]
        hashes = _hashes(f.get("block_hashes"))
        parent = f.get("parent_block_hash")
        tokens = f.get("token_ids")
        size = f.get("block_size")
        if not isinstance(size, int) or size < 1:
            raise BadFrame(f"block_size {size!r}")
        if (not isinstance(tokens, list) or len(tokens) > MAX_TOKENS
                or not all(type(t) is int for t in tokens)):
            raise BadFrame("token_ids is not a list of ints")
        if len(tokens) != size * len(hashes):
            raise BadFrame(f"{len(tokens)} token ids for {len(hashes)} blocks of {size}")
        win = f.get("kv_cache_spec_sliding_window")
        spec = f.get("kv_cache_spec_kind")
        return Stored(hashes, None if parent is None else _hash(parent), tuple(tokens), size,
                      _medium(f.get("medium")), _group(f.get("group_idx")) or 0,
                      spec if isinstance(spec, str) else None,
                      win if isinstance(win, int) else None)
    if kind == "BlockRemoved":
        f = _fields(e, _REMOVED_FIELDS)[1]
        return Removed(_hashes(f.get("block_hashes")), _medium(f.get("medium")),
                       _group(f.get("group_idx")))
    if kind == "AllBlocksCleared":
        return Cleared()
    if isinstance(kind, str):
        return None
    raise BadFrame("event without a type")


def _hash(h: Any) -> int:
    if type(h) is int and -(1 << 63) <= h <= MASK64:
        return h
    if isinstance(h, bytes) and 0 < len(h) <= 64:
        return int.from_bytes(h, "big") & MASK64  # vLLM's bytes hashes: the low 64 bits
    raise BadFrame(f"block hash {h!r:.40}")


def _hashes(hs: Any) -> tuple[int, ...]:
    if not isinstance(hs, list) or len(hs) > MAX_TOKENS:
        raise BadFrame("block_hashes is not a list")
    return tuple(_hash(h) for h in hs)


def _medium(m: Any) -> str:
    if m is None:
        return MEDIUM_GPU  # vLLM before media were published: the GPU pool
    if isinstance(m, str) and 0 < len(m) <= 64:
        return m
    raise BadFrame(f"medium {m!r:.40}")


def _group(g: Any) -> int | None:
    if g is None:
        return None
    if type(g) is int and 0 <= g < 1024:
        return g
    raise BadFrame(f"group_idx {g!r:.40}")
