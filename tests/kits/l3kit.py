"""Test kit for the cache's L3 tier: a storage-backed cache over a real backend, bounded waits
for prefetches, evicting a cache down to nothing, and a full round trip."""

from __future__ import annotations

import time
from pathlib import Path

from radixscope.cache import HiRadixCache
from radixscope.cache.storage import FileBackend, PrefetchConfig, StorageBackend
from radixscope.cache.storage.setup import StorageSetup
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import Driver, make_config


def storage_cache(root: Path | None, components=("full",), page_size: int = 1, *,
                  backend: StorageBackend | None = None, write_policy: str = "write_through",
                  policy: str = "wait_complete", threshold: int | None = None,
                  recorder=None, **kw) -> HiRadixCache:
    be = backend if backend is not None else FileBackend(Path(root) / "l3")
    cfg = make_config(components, page_size=page_size, **kw)
    pf = PrefetchConfig(policy=policy, threshold_tokens=page_size if threshold is None
                        else threshold, batch_pages=4, max_host_share=1.0)
    return HiRadixCache(cfg, recorder, storage=StorageSetup(be, write_policy=write_policy,
                                                            prefetch=pf))


def wait_prefetch(cache: HiRadixCache, req_id: str, timeout: float = 10.0) -> None:
    """Poll (checking the cache every step) until ``req_id``'s prefetch is handed back."""
    deadline = time.monotonic() + timeout
    while True:
        cache.poll()
        cache.check()
        st = cache.prefetch_state(req_id)
        if st is None or st.status != "ongoing":
            return
        assert time.monotonic() < deadline, f"prefetch {req_id} never handed back: {st}"
        time.sleep(0.002)


def evict_everything(cache: HiRadixCache) -> None:
    """Drop every device and host value (the tree ends up with the root only)."""
    cache.poll(wait=True)
    for c in reversed(cache.comps):
        cache.evict(10**9, component=c.name)
    for c in reversed(cache.comps):
        cache.evict_host(10**9, component=c.name)
    cache.check()


def stored_nodes(cache: HiRadixCache, comp: int = 0) -> list[int]:
    return sorted(n.id for n in cache.tree.nodes.values()
                  if n.data[comp].values[Tier.STORAGE] is not None)


def write_store(root: Path, tokens, components=("full",), page_size: int = 1,
                backend: StorageBackend | None = None) -> None:
    """A first cache writes ``tokens`` (content from the driver) to the store in ``root``."""
    a = storage_cache(root, components, page_size, backend=backend)
    Driver(a).insert(tokens)
    a.poll(wait=True)
    a.check()
    a.close()


def load_and_verify(cache: HiRadixCache, match, tokens) -> int:
    """Load ``match``'s host hit back, wait, verify the device content bit for bit, check().
    Returns the device prefix length verified."""
    lb = cache.load_back(match)
    cache.poll(wait=True)
    checked = Driver(cache).verify_device_prefix(tokens, lb.anchor)
    cache.check()
    assert checked == lb.device_prefix_len
    return checked


def round_trip(cache: HiRadixCache, tokens, req_id: str = "rt", extra_key=None) -> int:
    """Match with prefetch, wait for the hand-back, load back, verify device content bit for
    bit against what the driver wrote. Returns the tokens that came from L3."""
    m = cache.match_prefix(tokens, extra_key=extra_key, req_id=req_id, prefetch=True)
    assert m.prefetch_status == "started", m.prefetch_status
    wait_prefetch(cache, req_id)
    m = cache.match_prefix(tokens, extra_key=extra_key, req_id=req_id, prefetch=True)
    assert m.prefetch_status == "done"
    load_and_verify(cache, m, tokens)
    return m.storage_hit_length
