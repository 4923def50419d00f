"""Faults through the cache: backend errors, timeouts, torn files, stale existence answers, a
redis-server restarted mid-run -- the cache stays consistent (check() after every step), the
request proceeds with what landed, host pins are released, and every fault is counted in
``storage_stats()``. And the seed bug class 5 regression at the cache level: a prefetch is
never handed back while its SWA / MAMBA pool transfers are pending, whatever the policy."""

from __future__ import annotations

import pytest

from radixscope.cache.storage import FaultyBackend, FileBackend, RedisBackend
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import Driver
from tests.kits.l3kit import (
    load_and_verify,
    storage_cache,
    stored_nodes,
    wait_prefetch,
    write_store,
)
from tests.kits.prefetchkit import Gate
from tests.kits.storagekit import redis_server  # noqa: F401 -- fixture

HYBRID = ("full", "swa", "mamba")


def _toks(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def _no_l3_pins(c) -> bool:
    return not any(str(e.owner).startswith(("store:", "prefetch:")) for e in c.locks.values())


def _write(root, toks, comps=HYBRID, backend=None) -> None:
    write_store(root, toks, comps, 1, backend)


def _proceeds(c, toks, want_l3: int, req: str = "r") -> None:
    """The request's prefetch ends; it proceeds with what landed (verified on device)."""
    m = c.match_prefix(toks, req_id=req, prefetch=True)
    wait_prefetch(c, req)
    c.check()
    assert _no_l3_pins(c)
    m = c.match_prefix(toks, req_id=req, prefetch=True)
    assert m.prefetch_status == "done" and m.storage_hit_length == want_l3, m
    load_and_verify(c, m, toks)


# ---- seed bug class 5 ----------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["best_effort", "timeout"])
def test_never_handed_back_while_pool_transfers_are_pending(tmp_path, policy):
    """Fails with the guard in ``prefetch_policy.can_terminate`` removed: the cache's poll would
    hand the prefetch back (hit 0, FULL slots freed) while the SWA page get is still running."""
    toks = _toks(16)
    _write(tmp_path, toks)
    probe = storage_cache(tmp_path / "probe", HYBRID, 1)
    window_fp = probe.store_fps[probe.ci["swa"]].digest.hex()
    probe.close()
    gate = Gate(FileBackend(tmp_path / "l3"), lambda n, keys: keys[0].endswith(window_fp))
    c = storage_cache(tmp_path, HYBRID, 1, backend=gate, policy=policy)
    if policy == "timeout":
        c.prefetcher.config = type(c.prefetcher.config)(policy="timeout", threshold_tokens=1,
                                                        timeout_base_s=0.0,
                                                        timeout_per_ki_token_s=0.0)
    Driver(c).insert(toks[:4])  # a host prefix: the prefetch anchors (and pins) its node
    c.poll(wait=True)
    assert c.match_prefix(toks, req_id="r", prefetch=True).prefetch_status == "started"
    assert gate.entered.wait(10)  # FULL landed; the window's get is held open
    for _ in range(50):
        c.poll()
        c.check()
        assert c.prefetch_state("r").status == "ongoing"
        assert any(str(e.owner) == "prefetch:r" for e in c.locks.values())
    assert c.prefetcher.stats().refused_pool_pending >= 50
    gate.release()
    wait_prefetch(c, "r")
    st = c.prefetch_state("r")
    assert (st.status, st.hit_tokens, st.reason) == ("done", 12, "complete")
    _proceeds(c, toks, 12)
    c.close()


# ---- faults -------------------------------------------------------------------------------
@pytest.mark.parametrize("fault,status", [("failure_rate", "error"), ("timeout_rate", "timeout")])
def test_backend_errors_and_timeouts_on_write_and_read(tmp_path, fault, status):
    toks = _toks(12)
    bad = FaultyBackend(FileBackend(tmp_path / "l3"), seed=1, **{fault: 1.0})
    c = storage_cache(tmp_path, HYBRID, 1, backend=bad)
    Driver(c).insert(toks)
    c.poll(wait=True)
    c.check()
    assert stored_nodes(c) == [] and _no_l3_pins(c)   # nothing landed: nodes stay host-only
    w = c.storage_stats().writes
    assert w.pages_failed[status] == w.failed > 0 and w.pages_stored == 0
    c.evict(100)
    c.evict_host(100)
    c.check()
    _proceeds(c, toks, 0)  # exists fails: nothing fetched, the request runs with what it has
    s = c.storage_stats()
    assert s.prefetch.ended_by == {status: 1}
    assert sum(s.backend.errors.values()) > 0
    c.close()


def test_torn_files_are_misses_never_data(tmp_path):
    toks = _toks(12)
    _write(tmp_path, toks, backend=FaultyBackend(FileBackend(tmp_path / "l3"), torn_rate=1.0))
    c = storage_cache(tmp_path, HYBRID, 1)
    _proceeds(c, toks, 0)
    s = c.storage_stats()
    assert s.prefetch.failed_pages.get("corrupt", 0) >= 1
    assert s.prefetch.ended_by == {"corrupt": 1}
    c.close()


def test_torn_tail_keeps_what_landed(tmp_path):
    toks = _toks(16)
    _write(tmp_path, toks[:8], comps=("full",))
    _write(tmp_path, toks, comps=("full",),
           backend=FaultyBackend(FileBackend(tmp_path / "l3"), torn_rate=1.0))
    c = storage_cache(tmp_path, ("full",), 1)
    _proceeds(c, toks, 8)  # the first 8 pages were whole; the torn rest is a miss
    assert c.storage_stats().prefetch.failed_pages["corrupt"] >= 1
    c.close()


@pytest.mark.parametrize("comps", [("full",), HYBRID], ids=["full", "hybrid"])
def test_stale_exists_proceeds_with_what_landed(tmp_path, comps):
    toks = _toks(16)
    _write(tmp_path, toks[:8], comps=comps)  # only half is in L3
    stale = FaultyBackend(FileBackend(tmp_path / "l3"), stale_exists_rate=1.0)
    c = storage_cache(tmp_path, comps, 1, backend=stale)
    _proceeds(c, toks, 8)  # exists said 16; get failed at page 8
    s = c.storage_stats()
    assert s.prefetch.failed_pages["miss"] >= 1 and stale.injected["stale_exists"] == 1
    c.close()


def test_redis_restarted_mid_run(redis_server):  # noqa: F811
    toks = _toks(12)
    c = storage_cache(None, HYBRID, 1, backend=RedisBackend(redis_server.url))
    Driver(c).insert(toks)
    c.poll(wait=True)
    assert stored_nodes(c)
    c.check()
    redis_server.stop()                         # the server goes away mid-run
    more = _toks(12, base=500)
    Driver(c).insert(more)
    c.poll(wait=True)
    c.check()
    assert _no_l3_pins(c)
    assert c.storage_stats().writes.pages_failed.get("error", 0) > 0
    other = _toks(24, base=900)
    m = c.match_prefix(other, req_id="down", prefetch=True)
    assert m.prefetch_status == "started"
    wait_prefetch(c, "down")
    assert c.prefetch_state("down").hit_tokens == 0
    redis_server.start()                        # back, empty (no persistence)
    again = _toks(12, base=1300)
    Driver(c).insert(again)
    c.poll(wait=True)
    c.check()
    end = c.match_prefix(again).last_device_node
    assert c.tree.nodes[end].data[0].values[Tier.STORAGE] is not None  # writes land again
    c.evict(100)
    c.evict_host(100)
    _proceeds(c, again, 12, req="back")
    c.close()


def test_backend_restarted_and_emptied_mid_run(tmp_path):
    """The fault wrapper's restart: down for a few calls (errors), then back without its data."""
    toks = _toks(12)
    be = FaultyBackend(FileBackend(tmp_path / "l3"), seed=2)
    c = storage_cache(tmp_path, HYBRID, 1, backend=be)
    Driver(c).insert(toks)
    c.poll(wait=True)
    assert stored_nodes(c)
    be.restart(down_calls=2, lose_data=True)
    Driver(c).insert(_toks(12, base=500))  # its store hits the down backend
    c.poll(wait=True)
    c.check()
    assert c.storage_stats().writes.pages_failed.get("error", 0) > 0 and _no_l3_pins(c)
    c.evict(100)
    c.evict_host(100)
    c.check()
    _proceeds(c, toks, 0)  # what was stored before the restart is gone: the request recomputes
    again = _toks(12, base=900)
    Driver(c).insert(again)  # the backend is back: writes land again
    c.poll(wait=True)
    end = c.match_prefix(again).last_device_node
    assert c.tree.nodes[end].data[0].values[Tier.STORAGE] is not None
    assert be.injected["down"] == 2
    c.close()


# ---- a store in flight reads host slots: check() sees them freed (bug zoo class 8) -------------
@pytest.mark.parametrize("inject", [False, True])
def test_check_sees_a_store_whose_host_slots_were_freed(tmp_path, inject):
    """The writer thread reads a store's host slots until its ack. An eviction that ignores the
    store's host pins (the zoo's use-after-free fault) frees them: the bytes L3 gets would be
    another owner's under a valid checksum, so check() must name it. The real eviction keeps
    them (no violation)."""
    from radixscope.cache import zoo

    slow = FaultyBackend(FileBackend(tmp_path / "l3"), delay=1.0)  # the write stays in flight
    c = storage_cache(tmp_path, ("full", "swa"), backend=slow)
    Driver(c).insert(_toks(16))
    c.poll()  # the backup's ack starts the store of the chain (host-pinned until its ack)
    assert c.store_transfers
    si = c.ci["swa"]
    fired = zoo.inject(c, "host_use_after_free").fired if inject else ()
    c.evict_host(10**6, component="swa")
    names = {name for name, _node, _detail in c.violations()}
    if inject:
        assert fired
        assert {"transfer.slot_freed", "store.value_gone"} <= names, names
    else:
        assert names == set()
        assert c.host_pools[si].alloc.available < c.host_pools[si].alloc.capacity
    c.poll(wait=True)
    c.close()


def test_a_prefetch_start_that_raises_releases_the_anchor_pin(tmp_path):
    """``start`` can raise (a failed collective with several ranks): the host pin match took on
    the anchor goes with it, nothing else changes, and the next match works."""
    toks = _toks(32)
    _write(tmp_path, toks, ("full",))
    c = storage_cache(tmp_path, ("full",))
    Driver(c).insert(toks[:8])  # a host-resident anchor below the L3 pages
    c.poll(wait=True)
    c.evict(10**6)
    before = sorted((e.owner, e.anchor) for e in c.locks.values())
    real = c.prefetcher.start

    def broken(req_id, hashes):
        raise RuntimeError("all_reduce failed: peer rank went away")
    c.prefetcher.start = broken
    with pytest.raises(RuntimeError, match="peer rank"):
        c.match_prefix(toks, req_id="r", prefetch=True)
    assert sorted((e.owner, e.anchor) for e in c.locks.values()) == before
    c.check()
    c.prefetcher.start = real
    _proceeds(c, toks, 24)
    c.close()


def test_close_is_bounded_by_its_timeout_when_the_backend_hangs(tmp_path):
    """A store the backend never finishes does not hang ``close(timeout)``: it is left
    unacked (its pages are not marked stored)."""
    hung = FaultyBackend(FileBackend(tmp_path / "l3"), delay=30.0)
    c = storage_cache(tmp_path, ("full",), backend=hung)
    Driver(c).insert(_toks(16))
    c.poll()
    assert c.store_transfers
    c.close(timeout=0.2)
    assert c.store_transfers  # not acked: close gave up at its timeout instead of waiting 30 s
    assert stored_nodes(c) == []
