"""radixscope cache: a hierarchical radix tree over token ids with FULL / SWA / MAMBA components.

Public entry points: ``HiRadixCache`` and ``CacheConfig``; see ``cache/README.md`` for one row
per operation.
"""

from cache.config import CacheConfig
from cache.errors import CacheOutOfMemory, InvariantViolation, StaleHandle
from cache.hiradix import HiRadixCache
from cache.keys import TokenKey
from cache.results import EvictResult, InsertResult, LoadBackResult, LockReceipt, MatchResult

__all__ = [
    "CacheConfig", "HiRadixCache", "MatchResult", "InsertResult", "LockReceipt", "EvictResult",
    "LoadBackResult", "CacheOutOfMemory", "InvariantViolation", "StaleHandle", "TokenKey",
]
