"""L3 storage: chained page keys with a layout fingerprint, and batch page backends.

See ``cache/storage/README.md``. Backends: ``file`` (embedded default), ``redis``,
``mooncake`` (optional extra); ``FaultyBackend`` wraps any of them for fault tests. Client
libraries are imported only when their backend is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixscope.cache.lazy import lazy_exports

_EXPORTS = {
    "Fingerprint": "radixscope.cache.storage.keys",
    "page_hashes": "radixscope.cache.storage.keys",
    "block_hash64": "radixscope.cache.storage.keys",
    "namespace_seed": "radixscope.cache.storage.keys",
    "HostPages": "radixscope.cache.storage.pages",
    "PageStatus": "radixscope.cache.storage.results",
    "BatchResult": "radixscope.cache.storage.results",
    "ExistsResult": "radixscope.cache.storage.results",
    "StorageStats": "radixscope.cache.storage.results",
    "StorageBackend": "radixscope.cache.storage.base",
    "MAX_BATCH": "radixscope.cache.storage.base",
    "FileBackend": "radixscope.cache.storage.file_backend",
    "RedisBackend": "radixscope.cache.storage.redis_backend",
    "MooncakeBackend": "radixscope.cache.storage.mooncake_backend",
    "FaultyBackend": "radixscope.cache.storage.faults",
    "open_backend": "radixscope.cache.storage.factory",
    "PrefetchController": "radixscope.cache.storage.prefetch",
    "PrefetchPool": "radixscope.cache.storage.prefetch_op",
    "PrefetchResult": "radixscope.cache.storage.prefetch_op",
    "StartResult": "radixscope.cache.storage.prefetch_op",
    "PrefetchConfig": "radixscope.cache.storage.prefetch_policy",
    "StopPolicy": "radixscope.cache.storage.prefetch_policy",
    "StorageSetup": "radixscope.cache.storage.setup",
    "PrefetchState": "radixscope.cache.storage.setup",
    "StorageCacheStats": "radixscope.cache.storage.setup",
    "StoredPages": "radixscope.cache.storage.stored",
    "SingleRank": "radixscope.cache.storage.tp",
    "TorchRankGroup": "radixscope.cache.storage.tp",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from radixscope.cache.storage.base import MAX_BATCH, StorageBackend
    from radixscope.cache.storage.factory import open_backend
    from radixscope.cache.storage.faults import FaultyBackend
    from radixscope.cache.storage.file_backend import FileBackend
    from radixscope.cache.storage.keys import Fingerprint, block_hash64, namespace_seed, page_hashes
    from radixscope.cache.storage.mooncake_backend import MooncakeBackend
    from radixscope.cache.storage.pages import HostPages
    from radixscope.cache.storage.prefetch import PrefetchController
    from radixscope.cache.storage.prefetch_op import PrefetchPool, PrefetchResult, StartResult
    from radixscope.cache.storage.prefetch_policy import PrefetchConfig, StopPolicy
    from radixscope.cache.storage.redis_backend import RedisBackend
    from radixscope.cache.storage.results import BatchResult, ExistsResult, PageStatus, StorageStats
    from radixscope.cache.storage.setup import PrefetchState, StorageCacheStats, StorageSetup
    from radixscope.cache.storage.stored import StoredPages
    from radixscope.cache.storage.tp import SingleRank, TorchRankGroup


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
