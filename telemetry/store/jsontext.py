"""The store's JSON text: op attributes, journal chunks, info rows, keyframes.

msgspec's encoder writes the same compact JSON as the ``json`` module for what the store holds
(plain tuples, lists, dicts, strings, numbers, and created nodes' token arrays as lists),
5-6x faster (an op's attributes: 0.25 us instead of 1.5; a 9000-mutation journal chunk: 16 ms
instead of 75): before, the writer's largest cost per op. Beside ``json`` it writes NaN and
infinities as ``null`` (valid JSON, which SQLite's JSON functions need), sets, bytes and
dataclasses its own way, and a dict key JSON cannot name as its ``repr``; what it refuses
goes through the json module (``telemetry.record.encode.dumps``) as before. It lives here, not
beside ``encode.dumps``, because the record stage runs in the cache's process, which imports
no serialisation library beyond the standard one.
"""

from __future__ import annotations

from typing import Any

import msgspec

from radixscope.telemetry.record.encode import dumps as json_dumps
from radixscope.telemetry.record.encode import json_default

_ENCODER = msgspec.json.Encoder(enc_hook=json_default)
_encode = _ENCODER.encode


def dumps(value: Any) -> str:
    """Compact JSON text; tuples become lists, anything JSON cannot express its ``repr``."""
    if type(value) is int:  # most mutation values (pool counts): skip the encoder
        return str(value)
    try:
        return _encode(value).decode()
    except Exception:  # noqa: BLE001 - what msgspec refuses: the json module's way
        return json_dumps(value)


def json_bytes(value: Any) -> bytes:
    """``dumps(value)`` as UTF-8 bytes (keyframes: compressed, never decoded here)."""
    try:
        return _encode(value)
    except Exception:  # noqa: BLE001 - what msgspec refuses: the json module's way
        return json_dumps(value).encode()


def journal_chunk(mutations: list[tuple]) -> tuple[int, int, str]:
    """A ``journal`` row ``(seq_first, seq_last, data)`` for mutations in increasing seq order:
    ``data`` is the JSON array of the mutation tuples, encoded in one call."""
    return (mutations[0][0], mutations[-1][0], dumps(mutations))
