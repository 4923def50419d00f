"""``file``: the embedded L3 backend -- one directory, one file per page.

- Names: a key of lowercase hex and dots is its own file name (``{key}.kv``); any other key is
  hex-encoded (hashed past 200 characters), so no key can name a path outside the directory.
- Writes are atomic: the page goes to a hidden ``.{uuid}.tmp`` file in the same directory, then
  ``os.replace`` puts it in place; a reader sees the whole page or none. ``fsync=True`` also
  makes it durable across a power loss.
- Reads are bounded (a header, then at most the key + the caller's page size + 1 bytes; a header
  advertising more is a miss without reading on) and verified (``codec``): a
  short, torn, corrupt or foreign file is a miss, never data.
- A size cap with LRU eviction: an in-memory index (key -> bytes, in recency order, rebuilt
  from the directory by mtime at start) evicts the least recently used pages before a write
  would pass ``max_bytes``. Another process sharing the directory may evict too; its files
  simply become misses here.

Thread-safe: the index is guarded by a lock; file I/O runs outside it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

from radixscope.cache.storage import codec
from radixscope.cache.storage.base import MAX_BATCH, StorageBackend
from radixscope.cache.storage.results import PageStatus

_SAFE = re.compile(r"[0-9a-f.]{1,200}")
_SUFFIX = ".kv"


def file_name(key: str) -> str:
    """The file name of ``key``: itself if lowercase hex/dots, else its hex (or hash) form."""
    if _SAFE.fullmatch(key) and not key.startswith("."):
        return key + _SUFFIX
    raw = key.encode("utf-8")
    h = raw.hex() if len(raw) <= 100 else "h" + hashlib.sha256(raw).hexdigest()
    return "x" + h + _SUFFIX


class FileBackend(StorageBackend):
    """Pages as files in ``directory``.

    Args:
        directory: created if absent.
        max_bytes: size cap over stored files (None: unbounded).
        fsync: fsync each page before its rename (durable, slower).
        max_batch: pages per call chunk.
    """

    name = "file"

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | None = None,
                 fsync: bool = False, max_batch: int = MAX_BATCH) -> None:
        super().__init__(max_batch)
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"max_bytes must be an int >= 1 or None, got {max_bytes!r}")
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # file name -> bytes, LRU first
        self._used = 0
        self._evicted = 0
        try:
            if self.dir.exists() and not self.dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "is a file, not a directory")
            self.dir.mkdir(parents=True, exist_ok=True)
            if not os.access(self.dir, os.R_OK | os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "not readable and writable")
            self._scan()
        except OSError as e:
            raise ValueError(f"file storage directory {str(self.dir)!r} cannot be used: "
                             f"{e.strerror or type(e).__name__}") from None

    def _scan(self) -> None:
        found = []
        with os.scandir(self.dir) as it:
            for e in it:
                if e.name.endswith(_SUFFIX) and not e.name.startswith(".") and e.is_file():
                    st = e.stat()
                    found.append((st.st_mtime_ns, e.name, st.st_size))
        for _, name, size in sorted(found):
            self._index[name] = size
            self._used += size

    # ---- index ----
    def _touch(self, name: str, size: int | None = None) -> None:
        with self._lock:
            if name in self._index:
                self._index.move_to_end(name)
            elif size is not None:
                self._index[name] = size
                self._used += size

    def _forget(self, name: str) -> None:
        with self._lock:
            size = self._index.pop(name, None)
            if size is not None:
                self._used -= size

    def _reserve(self, size: int) -> bool:
        """Evict LRU pages until ``size`` more bytes fit under the cap. False if it cannot."""
        if self.max_bytes is None:
            return True
        if size > self.max_bytes:
            return False
        victims = []
        with self._lock:
            while self._used + size > self.max_bytes and self._index:
                name, vsize = self._index.popitem(last=False)
                self._used -= vsize
                victims.append(name)
            self._evicted += len(victims)
        for name in victims:
            try:
                os.unlink(self.dir / name)
            except FileNotFoundError:
                pass
        return True

    # ---- primitives ----
    def _exists(self, keys: list[str]) -> int:
        n = 0
        for k in keys:
            if not os.path.exists(self.dir / file_name(k)):
                break
            n += 1
        return n

    def _get(self, keys: list[str],
             max_payload: int = codec.MAX_PAGE_BYTES) -> list[bytes | memoryview | None]:
        out: list[bytes | memoryview | None] = []
        for k in keys:
            name = file_name(k)
            try:
                with open(self.dir / name, "rb") as f:
                    # bounded: a header, then the advertised key + payload + 1 byte, and a
                    # payload larger than the caller's page is not read at all (a miss)
                    head = f.read(codec.HEAD_BYTES)
                    limit = codec.payload_limit(head, min(max_payload, codec.MAX_PAGE_BYTES))
                    blob = head + f.read(limit + 1) if limit >= 0 else head
            except FileNotFoundError:
                self._forget(name)
                out.append(None)
                continue
            self._touch(name)
            out.append(blob)
        return out

    def _put(self, keys: list[str], blobs: list[bytes]) -> list[PageStatus]:
        out = []
        for k, blob in zip(keys, blobs, strict=False):
            name = file_name(k)
            final = self.dir / name
            if os.path.exists(final):
                self._touch(name)
                out.append(PageStatus.EXISTS)
                continue
            if not self._reserve(len(blob)):
                out.append(PageStatus.FULL)
                continue
            tmp = self.dir / f".{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(blob)
                    if self.fsync:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, final)
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            self._touch(name, len(blob))
            out.append(PageStatus.OK)
        return out

    def _delete(self, keys: list[str]) -> list[PageStatus]:
        out = []
        for k in keys:
            name = file_name(k)
            self._forget(name)
            try:
                os.unlink(self.dir / name)
                out.append(PageStatus.OK)
            except FileNotFoundError:
                out.append(PageStatus.MISS)
        return out

    def _discard(self, keys: list[str]) -> None:
        self._delete(keys)

    def _clear(self) -> None:
        with self._lock:
            self._index.clear()
            self._used = 0
        with os.scandir(self.dir) as it:
            names = [e.name for e in it if e.name.endswith((_SUFFIX, ".tmp"))]
        for name in names:
            try:
                os.unlink(self.dir / name)
            except FileNotFoundError:
                pass

    def _holding(self) -> tuple[int, int, int]:
        with self._lock:
            return len(self._index), self._used, self._evicted
