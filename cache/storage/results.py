"""Frozen results of storage operations: failures are values, with per-page status and reasons.

No backend operation raises into the cache for a backend failure (connection lost, timeout,
torn or corrupt page, full store); it returns one of these. Bad input from the caller (keys and
host indices of different lengths, wrong types) raises ``TypeError``/``ValueError`` before any
I/O.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass


class PageStatus(str, enum.Enum):
    """Outcome for one page of a batch call; each value is its member's name in lowercase."""

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list) -> str:
        return name.lower()

    OK = enum.auto()        # stored / read / deleted
    EXISTS = enum.auto()    # set: already stored (SET NX semantics); counts as stored
    MISS = enum.auto()      # get/delete: not in the store
    CORRUPT = enum.auto()   # get: short, torn, wrong header or checksum -> treated as a miss
    MISMATCH = enum.auto()  # get: header names another key/fingerprint -> treated as a miss
    BUSY = enum.auto()      # delete: held by a reader's lease (Mooncake); retry later
    FULL = enum.auto()      # set: no room (page larger than the cap, or eviction failed)
    TIMEOUT = enum.auto()   # the backend did not answer in time
    ERROR = enum.auto()     # the backend failed (connection refused, I/O error...)

    @property
    def ok(self) -> bool:
        return self in (PageStatus.OK, PageStatus.EXISTS)


@dataclass(frozen=True)
class BatchResult:
    """Per-page outcome of a batch get / set / delete.

    Attributes:
        op: ``get``, ``set`` or ``delete``.
        statuses: one status per key, in key order.
        nbytes: payload bytes moved (pages OK).
        seconds: wall time of the call.
        error: the first backend error message, if any (for logs; reasons are in ``statuses``).
    """

    op: str
    statuses: tuple[PageStatus, ...]
    nbytes: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok_count(self) -> int:
        return sum(s.ok for s in self.statuses)

    @property
    def prefix_ok(self) -> int:
        """Pages OK contiguously from the first: what a prefetch can use."""
        n = 0
        for s in self.statuses:
            if not s.ok:
                break
            n += 1
        return n

    @property
    def all_ok(self) -> bool:
        return all(s.ok for s in self.statuses)

    def reasons(self) -> dict[str, int]:
        """Pages per non-OK status, e.g. ``{"corrupt": 1, "miss": 3}``."""
        return dict(Counter(s.value for s in self.statuses if not s.ok))


@dataclass(frozen=True)
class ExistsResult:
    """Answer of ``batch_exists``.

    Attributes:
        count: pages present contiguously from the first key (0 on failure).
        status: ``OK``, or why the answer is unknown (``ERROR``/``TIMEOUT``): count is then 0.
        seconds: wall time.
        error: the backend error message, if any.
    """

    count: int
    status: PageStatus = PageStatus.OK
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class StorageStats:
    """Counters since the backend was created (a copy; never mutated).

    Attributes:
        backend: backend name.
        calls: calls per op (``exists``, ``get``, ``set``, ``delete``, ``clear``).
        pages: pages per ``"op.status"`` (``"get.ok"``, ``"get.corrupt"``, ``"set.exists"``...).
        bytes_read / bytes_written: payload bytes.
        seconds: wall time per op.
        errors: failures per ``"op.ExceptionType"`` (from backend exceptions turned into values).
        stored_pages / stored_bytes: what the backend holds, where it knows (-1 otherwise).
        evicted_pages: pages the backend's own cap evicted (-1 where it does not know).
    """

    backend: str
    calls: dict[str, int]
    pages: dict[str, int]
    bytes_read: int
    bytes_written: int
    seconds: dict[str, float]
    errors: dict[str, int]
    stored_pages: int = -1
    stored_bytes: int = -1
    evicted_pages: int = -1

    def bandwidth(self, op: str) -> float:
        """Payload bytes/s of ``get`` or ``set`` over the time spent in it."""
        t = self.seconds.get(op, 0.0)
        b = self.bytes_read if op == "get" else self.bytes_written
        return b / t if t > 0 else 0.0
