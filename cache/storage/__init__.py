"""L3 storage: chained page keys with a layout fingerprint, and batch page backends.

See ``cache/storage/README.md``. Backends: ``file`` (embedded default), ``redis``,
``mooncake`` (optional extra); ``FaultyBackend`` wraps any of them for fault tests. Client
libraries are imported only when their backend is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cache.lazy import lazy_exports

_EXPORTS = {
    "Fingerprint": "cache.storage.keys",
    "page_hashes": "cache.storage.keys",
    "block_hash64": "cache.storage.keys",
    "namespace_seed": "cache.storage.keys",
    "HostPages": "cache.storage.pages",
    "PageStatus": "cache.storage.results",
    "BatchResult": "cache.storage.results",
    "ExistsResult": "cache.storage.results",
    "StorageStats": "cache.storage.results",
    "StorageBackend": "cache.storage.base",
    "MAX_BATCH": "cache.storage.base",
    "FileBackend": "cache.storage.file_backend",
    "RedisBackend": "cache.storage.redis_backend",
    "MooncakeBackend": "cache.storage.mooncake_backend",
    "FaultyBackend": "cache.storage.faults",
    "open_backend": "cache.storage.factory",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from cache.storage.base import MAX_BATCH, StorageBackend
    from cache.storage.factory import open_backend
    from cache.storage.faults import FaultyBackend
    from cache.storage.file_backend import FileBackend
    from cache.storage.keys import Fingerprint, block_hash64, namespace_seed, page_hashes
    from cache.storage.mooncake_backend import MooncakeBackend
    from cache.storage.pages import HostPages
    from cache.storage.redis_backend import RedisBackend
    from cache.storage.results import BatchResult, ExistsResult, PageStatus, StorageStats


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
