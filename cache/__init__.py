"""radixscope cache: a hierarchical radix tree over token ids with FULL / SWA / MAMBA components.

Public entry points: ``HiRadixCache`` and ``CacheConfig``; see ``cache/README.md`` for one row
per operation.

The names below are imported on first use (PEP 562), so that modules needing only the cache's
plain-data parts (``cache.events``, ``cache.snapshot``: the telemetry writer process, the UI,
notebooks reading a store) do not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cache.lazy import lazy_exports

_EXPORTS = {
    "CacheConfig": "cache.config",
    "HiRadixCache": "cache.hiradix",
    "TokenKey": "cache.keys",
    "CacheOutOfMemory": "cache.errors",
    "InvariantViolation": "cache.errors",
    "StaleHandle": "cache.errors",
    "MatchResult": "cache.results",
    "InsertResult": "cache.results",
    "LockReceipt": "cache.results",
    "EvictResult": "cache.results",
    "LoadBackResult": "cache.results",
    "TransferId": "cache.results",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from cache.config import CacheConfig
    from cache.errors import CacheOutOfMemory, InvariantViolation, StaleHandle
    from cache.hiradix import HiRadixCache
    from cache.keys import TokenKey
    from cache.results import (
        EvictResult,
        InsertResult,
        LoadBackResult,
        LockReceipt,
        MatchResult,
        TransferId,
    )


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
