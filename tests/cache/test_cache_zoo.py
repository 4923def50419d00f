"""Bug-zoo classes driven on the cache (or the prefetch controller) directly: class 3 on seed
001's tree (no L3 tier: the blind cascade alone) and class 6 on a bare prefetch controller (their
engine runs are in tests/engine/test_zoo.py). Each is caught in the operation where the buggy
variant fired."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixscope.cache import zoo
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.storage import FileBackend
from radixscope.cache.storage.prefetch_policy import can_terminate
from tests.cache.test_cache_storage_prefetch import cfg
from tests.kits.cachekit import seed_001_tree
from tests.kits.prefetchkit import POOL_SETS, Gate, Rig, drive, settle


@pytest.mark.parametrize("hold", ["lock", "host_ref"])
def test_class_3_tombstone_cascade_is_caught_by_the_evict_that_does_it(hold):
    """Seed 001's tree: node 2 (no MAMBA state: useless once childless) is locked, or its
    backup is in flight. The buggy cascade deletes it with its children; ``check()`` right
    after that evict names the deleted node the lock table still pins."""
    c, _ = seed_001_tree()
    if hold == "lock":
        c.lock(2, owner="req-9")
    else:
        assert c.backup(2) == 1
    inj = zoo.inject(c, "tombstone_cascade")
    c.check()
    r = c.evict(8)
    assert r.deleted == (1, 3, 2)  # the bug: node 2 went too
    [fired] = inj.fired
    assert fired.op_id == c.current_op_id and fired.nodes == (2,)
    with pytest.raises(InvariantViolation) as e:
        c.check()
    names = {v[0] for v in e.value.violations}
    assert "lock.dead_pin" in names
    assert any(v[1] == 2 for v in e.value.violations)


def test_class_6_prefetch_stopped_with_pool_transfers_pending_is_caught_in_that_poll(
        tmp_path: Path) -> None:
    """Seed 004: FULL has landed, the SWA page at its end is still being fetched. The pre-fix
    vote says "complete"; the controller's stop commit re-checks the rule and raises in the
    poll that would have stopped it, before anything is handed back or freed. Without that
    re-check the poll hands back a 0-token result (the hit is lost)."""
    rig = Rig(tmp_path, POOL_SETS["full+swa"])
    rig.write()
    aux_fp = rig.fp["swa"].digest.hex()
    gate = Gate(rig.store, lambda n, keys: keys[0].endswith(aux_fp))
    ctl = rig.controller(gate, cfg("wait_complete"))
    inj = zoo.inject(ctl, "prefetch_pool_pending", target="prefetch")
    ctl.start("r", rig.hashes)
    assert gate.entered.wait(10)
    assert ctl._ops["r"].full_done and not ctl._ops["r"].worker_done
    with pytest.raises(InvariantViolation, match="prefetch.terminated_pool_pending") as e:
        ctl.poll()
    [fired] = inj.fired
    assert fired.op_id == inj.polls == 1  # caught in the poll it fired in
    assert e.value.violations[0][1] == ctl._ops["r"].seq
    assert ctl.ongoing("r")  # nothing was handed back or freed
    ctl.check()
    gate.release()
    ctl._can_terminate = can_terminate  # the fixed rule: the prefetch completes
    [r] = drive(ctl)
    assert r.tokens == 64
    rig.free(r)
    settle(ctl)
    assert rig.all_free()
    ctl.close()


def test_the_prefetch_fault_goes_on_a_cache_with_pools_or_a_controller():
    assert "prefetch_pool_pending" in zoo.names()  # --inject takes it (an L3 engine run)
    assert zoo.names("prefetch") == ("prefetch_pool_pending",)
    with pytest.raises(zoo.UnknownFault, match="the zoo has: prefetch_pool_pending"):
        zoo.inject(object(), "load_back_anchor", target="prefetch")
    from radixscope.cache import CacheConfig, HiRadixCache

    plain = HiRadixCache(CacheConfig.preset("hybrid", device="cpu"))
    with pytest.raises(ValueError, match="needs an L3 tier .* this cache has no L3 tier"):
        zoo.inject(plain, "prefetch_pool_pending")


def test_class_6_on_a_cache_the_failing_poll_is_a_recorded_prefetch_op_named_on_its_anchor(
        tmp_path: Path) -> None:
    """The fault on a cache with an L3 tier: the stop commit's refusal leaves the cache's
    ``poll`` as a ``prefetch`` op record carrying the error, handed to the crash hook, naming the
    prefetch's anchor node (not the controller's prefetch seq); the cache's op nesting is back
    at 0, so the next poll is recorded as an op of its own and hands the prefetch back."""
    from radixscope.cache import events as ev
    from radixscope.cache.events import FlightRecorder
    from tests.kits.cachekit import Driver
    from tests.kits.l3kit import storage_cache, wait_prefetch, write_store

    toks = list(range(100, 116))
    write_store(tmp_path, toks, ("full", "swa"), 1)
    gate = Gate(FileBackend(tmp_path / "l3"), lambda n, keys: False)
    rec = FlightRecorder()
    c = storage_cache(tmp_path, ("full", "swa"), 1, backend=gate, recorder=rec)
    Driver(c).insert(toks[:4])
    c.poll(wait=True)
    anchor = c.match_prefix(toks).best_match_node
    swa_fp = c.store_fps[1].digest.hex()
    gate.hold = lambda n, keys: keys[0].endswith(swa_fp)  # the pool read waits
    inj = zoo.inject(c, "prefetch_pool_pending")
    hooked = []
    c.error_hook = lambda op, e: hooked.append((op, e))
    assert c.match_prefix(toks, req_id="r", prefetch=True).prefetch_status == "started"
    assert gate.entered.wait(10)
    with pytest.raises(InvariantViolation) as e:
        c.poll()
    assert e.value.rule == "prefetch.terminated_pool_pending" and e.value.nodes == (anchor,)
    assert e.value.violations[0][1] == anchor
    [fired] = inj.fired
    ops, _ = rec.tail()
    assert (ops[-1].op, ops[-1].op_id, ops[-1].req_id) == (ev.OP_PREFETCH, fired.op_id, "r")
    assert ops[-1].error.startswith("InvariantViolation") and c.current_op_id == fired.op_id
    assert hooked == [(ev.OP_PREFETCH, e.value)]
    assert c._depth == 0
    c.prefetcher._can_terminate = can_terminate  # the fixed rule from here on
    gate.release()
    wait_prefetch(c, "r")
    c.poll()
    ops, _ = rec.tail()
    assert ops[-1].op == ev.OP_PREFETCH and ops[-1].op_id > fired.op_id and ops[-1].error is None
    assert c.prefetch_state("r").hit_tokens == 12
    c.check()
    c.close()
