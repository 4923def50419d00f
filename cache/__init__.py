"""radixscope cache: a hierarchical radix tree over token ids with FULL / SWA / MAMBA components.

Public entry points: ``HiRadixCache`` and ``CacheConfig``; see ``cache/README.md`` for one row
per operation.

The names below are imported on first use (PEP 562), so that modules needing only the cache's
plain-data parts (``cache.events``, ``cache.snapshot``: the telemetry writer process, the UI,
notebooks reading a store) do not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixscope.cache.lazy import lazy_exports

_EXPORTS = {
    "CacheConfig": "radixscope.cache.config",
    "HiRadixCache": "radixscope.cache.hiradix",
    "TokenKey": "radixscope.cache.keys",
    "CacheOutOfMemory": "radixscope.cache.errors",
    "InvariantViolation": "radixscope.cache.errors",
    "StaleHandle": "radixscope.cache.errors",
    "MatchResult": "radixscope.cache.results",
    "InsertResult": "radixscope.cache.results",
    "LockReceipt": "radixscope.cache.results",
    "EvictResult": "radixscope.cache.results",
    "LoadBackResult": "radixscope.cache.results",
    "TransferId": "radixscope.cache.results",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from radixscope.cache.config import CacheConfig
    from radixscope.cache.errors import CacheOutOfMemory, InvariantViolation, StaleHandle
    from radixscope.cache.hiradix import HiRadixCache
    from radixscope.cache.keys import TokenKey
    from radixscope.cache.results import (
        EvictResult,
        InsertResult,
        LoadBackResult,
        LockReceipt,
        MatchResult,
        TransferId,
    )


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
