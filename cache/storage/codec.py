"""The stored form of one page: a header naming the key, then the payload.

``MAGIC(4) | version u8 | key length u16 | payload length u64 | crc32 u32 | key | payload``,
little-endian. Every backend stores pages in this form, so a reader can tell a whole page of
the right key (and so the right fingerprint, which the key carries) from a short, torn,
corrupt or foreign one, whatever the store did to it. A page that does not decode is a miss.
"""

from __future__ import annotations

import struct
import zlib

from radixscope.cache.storage.results import PageStatus

MAGIC = b"RSKV"
VERSION = 1
_HEAD = struct.Struct("<4sBHQI")
HEAD_BYTES = _HEAD.size
MAX_KEY_BYTES = 1024


def header(key: str, payload: memoryview | bytes) -> bytes:
    """The header of ``payload`` stored under ``key``."""
    raw = key.encode("ascii")
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"key of {len(raw)} bytes is longer than {MAX_KEY_BYTES}")
    return _HEAD.pack(MAGIC, VERSION, len(raw), len(payload), zlib.crc32(payload)) + raw


def encode(key: str, payload: memoryview | bytes) -> bytes:
    """Header + payload as one bytes object."""
    return header(key, payload) + bytes(payload)


def frame_bytes(key: str, payload_nbytes: int) -> int:
    """Stored size of a page: header + key + payload."""
    return HEAD_BYTES + len(key.encode("ascii")) + payload_nbytes


def decode(key: str, blob: bytes | memoryview | None, payload_nbytes: int
           ) -> tuple[PageStatus, memoryview | None]:
    """Check ``blob`` is the page ``key`` with a ``payload_nbytes`` payload.

    Returns ``(OK, payload view)``, or ``(MISS | CORRUPT | MISMATCH, None)``.
    """
    if blob is None or len(blob) == 0:
        return PageStatus.MISS, None
    view = memoryview(blob).cast("B")
    if len(view) < HEAD_BYTES:
        return PageStatus.CORRUPT, None
    magic, version, klen, plen, crc = _HEAD.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        return PageStatus.CORRUPT, None
    want = key.encode("ascii")
    if len(view) != HEAD_BYTES + klen + plen:
        return PageStatus.CORRUPT, None
    if klen != len(want) or view[HEAD_BYTES:HEAD_BYTES + klen] != want:
        return PageStatus.MISMATCH, None
    if plen != payload_nbytes:
        return PageStatus.MISMATCH, None
    payload = view[HEAD_BYTES + klen:]
    if zlib.crc32(payload) != crc:
        return PageStatus.CORRUPT, None
    return PageStatus.OK, payload


MAX_PAGE_BYTES = 1 << 30  # no stored page is read past this, whatever its header says


def payload_limit(head: bytes, max_bytes: int) -> int:
    """Key + payload bytes a header advertises (to bound a read), or -1 if it is not a header
    or advertises more than ``max_bytes``."""
    if len(head) < HEAD_BYTES:
        return -1
    magic, version, klen, plen, _ = _HEAD.unpack_from(head)
    if magic != MAGIC or version != VERSION or plen > max_bytes:
        return -1
    return klen + plen
