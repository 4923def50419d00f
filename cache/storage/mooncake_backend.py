"""``mooncake``: SGLang's own L3 store (``mooncake.store.MooncakeDistributedStore``), optional.

Install the extra (``pip install 'radixscope[mooncake]'``, i.e.
``mooncake-transfer-engine-non-cuda``; the binaries need ``libibverbs1`` even for TCP). The
store needs a ``mooncake_master`` (with its HTTP metadata server) and memory segments: either
this client mounts ``global_segment_size`` bytes itself (embedded; its keys go when the process
exits), or a standalone ``mooncake_client`` process owns them and this client mounts 0.

- ``_put``: ``batch_is_exist`` then ``put_batch`` of the absent keys (SET NX semantics; a race
  between two writers of one page is harmless: same bytes).
- ``_get``: ``get_batch`` (an absent key comes back empty -> miss).
- ``_exists``: ``batch_is_exist`` (1 present, 0 absent, < 0 error).
- ``_delete``: ``batch_remove``. Mooncake holds a read lease (``--default_kv_lease_ttl``,
  10 s by default) during which a remove fails with -706: reported as ``BUSY``.
- ``_clear``: ``remove_by_regex`` over the prefix, forced past leases.
- The memory cap is the segments' size; the master evicts (its high watermark) when full.

Bytes are copied through Python objects here; zero-copy ``batch_get_into`` /
``batch_put_from`` into a registered host pool is the integration step's optimisation.
"""

from __future__ import annotations

import re
from typing import Any

from radixscope.cache.storage import codec
from radixscope.cache.storage.base import MAX_BATCH, StorageBackend
from radixscope.cache.storage.results import PageStatus

LEASE_HELD = -706  # remove() while a reader's lease is held
NOT_FOUND = -704


class MooncakeError(RuntimeError):
    """A Mooncake call returned an error code."""


class MooncakeBackend(StorageBackend):
    """Pages in a Mooncake store.

    Args:
        master: ``HOST:PORT`` of ``mooncake_master``'s RPC.
        metadata_server: ``http://HOST:PORT/metadata`` (the master's HTTP metadata server), or
            ``P2PHANDSHAKE``.
        local_hostname: this client's address (``127.0.0.1`` on one machine).
        protocol: ``tcp`` (CPU) or ``rdma``.
        global_segment_size: bytes this client contributes (0 with a standalone client).
        local_buffer_size: this client's transfer buffer.
        prefix: key namespace (``clear`` removes keys under it).
        device_name: RDMA device ("" for TCP).
        max_batch: pages per call chunk.
    """

    name = "mooncake"

    def __init__(self, master: str, metadata_server: str, local_hostname: str = "127.0.0.1",
                 protocol: str = "tcp", global_segment_size: int = 0,
                 local_buffer_size: int = 64 << 20, prefix: str = "rs:kv:",
                 device_name: str = "", max_batch: int = MAX_BATCH) -> None:
        super().__init__(max_batch)
        from mooncake.store import MooncakeDistributedStore  # lazy: optional extra

        self.prefix = prefix
        self._store: Any = MooncakeDistributedStore()
        rc = self._store.setup(local_hostname, metadata_server, global_segment_size,
                               local_buffer_size, protocol, device_name, master)
        if rc != 0:
            raise MooncakeError(f"MooncakeDistributedStore.setup(..., master={master!r}) "
                                f"returned {rc}")

    def _k(self, keys: list[str]) -> list[str]:
        p = self.prefix
        return [p + k for k in keys]

    def _present(self, keys: list[str]) -> list[int]:
        codes = list(self._store.batch_is_exist(self._k(keys)))
        if len(codes) != len(keys) or any(c < 0 for c in codes):
            raise MooncakeError(f"batch_is_exist returned {codes[:8]}")
        return codes

    def _exists(self, keys: list[str]) -> int:
        n = 0
        for c in self._present(keys):
            if c != 1:
                break
            n += 1
        return n

    def _get(self, keys: list[str],
             max_payload: int = codec.MAX_PAGE_BYTES) -> list[bytes | memoryview | None]:
        return [b if b else None for b in self._store.get_batch(self._k(keys))]

    def _put(self, keys: list[str], blobs: list[bytes]) -> list[PageStatus]:
        present = self._present(keys)
        todo = [i for i, c in enumerate(present) if c != 1]
        out = [PageStatus.EXISTS] * len(keys)
        if todo:
            rc = self._store.put_batch([self.prefix + keys[i] for i in todo],
                                       [blobs[i] for i in todo])
            if rc == 0:
                for i in todo:
                    out[i] = PageStatus.OK
                return out
            # a concurrent writer of the same page fails the whole batch: what is there now
            # exists; the rest is put one by one
            now = self._present([keys[i] for i in todo])
            for i, c in zip(todo, now, strict=True):
                if c == 1:
                    continue
                rc = self._store.put(self.prefix + keys[i], blobs[i])
                out[i] = PageStatus.OK if rc == 0 else PageStatus.ERROR
        return out

    def _delete(self, keys: list[str]) -> list[PageStatus]:
        # no existence check first: batch_is_exist would renew the very lease that blocks removal
        codes = list(self._store.batch_remove(self._k(keys)))
        if len(codes) != len(keys):
            raise MooncakeError(f"batch_remove returned {len(codes)} codes for {len(keys)} keys")
        return [PageStatus.OK if rc == 0 else PageStatus.MISS if rc == NOT_FOUND
                else PageStatus.BUSY if rc == LEASE_HELD else PageStatus.ERROR for rc in codes]

    def _discard(self, keys: list[str]) -> None:
        self._delete(keys)

    def _clear(self) -> None:
        rc = self._store.remove_by_regex("^" + re.escape(self.prefix) + ".*", True)
        if rc < 0:
            raise MooncakeError(f"remove_by_regex returned {rc}")

    def close(self) -> None:
        try:
            self._store.close()
        except Exception:  # noqa: BLE001 -- closing a dead client is not a failure
            pass

