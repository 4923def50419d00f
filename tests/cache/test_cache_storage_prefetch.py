"""Prefetch L3 -> host: every policy, the threshold, the rate limit, abort, every fault of
``FaultyBackend``, content bit for bit, and the bug-class-5 guard (never terminated while pool
transfers are pending)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixscope.cache.storage import FaultyBackend, PrefetchConfig, StopPolicy
from radixscope.cache.storage import prefetch_events as pe
from radixscope.cache.storage.prefetch_events import ListObserver
from tests.kits.prefetchkit import (
    HOST_PAGES,
    POOL_SETS,
    Gate,
    P,
    Rig,
    drive,
    settle,
    wait_for,
)


def cfg(policy: str = "wait_complete", **kw: object) -> PrefetchConfig:
    return PrefetchConfig(policy=StopPolicy(policy), threshold_tokens=kw.pop("threshold", 2 * P),
                          batch_pages=4, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("pools", list(POOL_SETS))
@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_complete_prefetch_is_bit_exact(tmp_path: Path, pools: str, policy: str) -> None:
    rig = Rig(tmp_path, POOL_SETS[pools])
    rig.write()
    obs = ListObserver()
    ctl = rig.controller(config=cfg(policy, timeout_base_s=60.0), observer=obs)
    assert ctl.start("r", rig.hashes).started
    if policy == "best_effort":  # would stop at once: let it finish first
        wait_for(lambda: ctl._ops["r"].worker_done)
    [r] = drive(ctl)
    assert (r.tokens, r.reason, r.hit_tokens, r.asked_tokens) == (64, "complete", 64, 64)
    rig.verify(r)
    settle(ctl)
    rig.free(r)
    assert rig.all_free()
    st = ctl.stats()
    assert (st.started, st.ended, st.prefetched_tokens, st.hit_tokens) == (1, 1, 64, 64)
    assert st.bytes_read > 0 and st.bandwidth > 0
    kinds = [e.kind for e in obs.events]
    assert kinds[0] == pe.PREFETCH_START and kinds[-1] == pe.PREFETCH_END
    assert pe.STORAGE_EXISTS in kinds and pe.STORAGE_GET in kinds and pe.PREFETCH_PROGRESS in kinds
    assert obs.of(pe.PREFETCH_END)[0].attrs[pe.A_TOKENS] == 64
    ctl.close()


def test_threshold_declines_without_allocating(tmp_path: Path) -> None:
    rig = Rig(tmp_path, n_pages=16)
    rig.write()
    ctl = rig.controller(config=cfg(threshold=256))  # 16 pages x 4 = 64 tokens < 256
    r = ctl.start("r", rig.hashes)
    assert (r.started, r.reason, r.tokens) == (False, pe.R_BELOW_THRESHOLD, 64)
    assert rig.all_free() and not ctl.ongoing("r")
    assert ctl.stats().declined == {pe.R_BELOW_THRESHOLD: 1}
    assert ctl.stats().unfulfilled == {pe.R_BELOW_THRESHOLD: 64}
    assert PrefetchConfig().threshold_tokens == 256
    ctl.close()


def test_storage_hit_below_threshold_fetches_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.write(pages=1)  # 4 tokens in storage, threshold 8
    ctl = rig.controller(config=cfg())
    ctl.start("r", rig.hashes)
    [r] = drive(ctl)
    assert (r.tokens, r.reason) == (0, pe.R_STORAGE_MISS)
    settle(ctl)
    assert rig.all_free()
    assert ctl.stats().get_calls == 0
    ctl.close()


def test_partial_storage_gives_the_stored_prefix(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ("swa", "mamba"))
    rig.write(pages=10)
    ctl = rig.controller(config=cfg())
    ctl.start("r", rig.hashes)
    [r] = drive(ctl)
    assert (r.tokens, r.hit_tokens, r.reason) == (40, 40, pe.R_STORAGE_MISS)
    rig.verify(r)  # SWA window and MAMBA state aligned to page 10, not 16
    settle(ctl)
    rig.free(r)
    assert rig.all_free()
    assert ctl.stats().unfulfilled == {pe.R_STORAGE_MISS: 24}
    ctl.close()


def test_best_effort_stops_when_asked_and_drains_in_flight_slots(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.write()
    gate = Gate(rig.store, lambda n, keys: n == 2)  # the second FULL batch blocks
    ctl = rig.controller(gate, cfg("best_effort"))
    ctl.start("r", rig.hashes)
    assert gate.entered.wait(10)
    [r] = drive(ctl)
    assert (r.tokens, r.reason) == (16, pe.R_TERMINATED)  # the first batch of 4 pages
    rig.verify(r)
    # the blocked batch still writes into its slots: they stay held until the worker is done
    assert len(ctl._draining) == 1 and ctl.occupied_tokens == 48
    ctl.check()
    gate.release()
    settle(ctl)
    assert ctl.occupied_tokens == 0
    rig.free(r)
    assert rig.all_free()
    assert ctl.stats().unfulfilled == {pe.R_TERMINATED: 48}
    ctl.close()


def test_wait_complete_waits(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.write()
    gate = Gate(rig.store, lambda n, keys: n == 3)
    ctl = rig.controller(gate, cfg("wait_complete"))
    ctl.start("r", rig.hashes)
    assert gate.entered.wait(10)
    for _ in range(20):
        assert ctl.poll() == ()
    assert ctl.ongoing("r") and ctl.completed_tokens("r") == 32
    gate.release()
    [r] = drive(ctl)
    assert (r.tokens, r.reason) == (64, "complete")
    rig.verify(r)
    rig.free(r)
    settle(ctl)
    assert rig.all_free()
    ctl.close()


def test_timeout_stops_past_the_budget(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.write()
    now = [100.0]
    gate = Gate(rig.store, lambda n, keys: n == 2)
    ctl = rig.controller(gate, cfg("timeout"), clock=lambda: now[0])
    ctl.start("r", rig.hashes)
    budget = 1.0 + 16 * P / 1024 * 0.25  # defaults: 1 s + 0.25 s per 1024 tokens
    assert ctl._ops["r"].budget_s == pytest.approx(budget)
    assert gate.entered.wait(10)
    now[0] += budget - 0.01
    assert ctl.poll() == ()
    now[0] += 0.02
    [r] = ctl.poll()
    assert (r.tokens, r.reason) == (16, pe.R_DEADLINE)
    rig.verify(r)
    gate.release()
    settle(ctl)
    rig.free(r)
    assert rig.all_free()
    ctl.close()


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
@pytest.mark.parametrize("pools", ["full+swa", "full+mamba", "full+swa+mamba"])
def test_never_terminated_while_pool_transfers_are_pending(tmp_path: Path, policy: str,
                                                           pools: str) -> None:
    """Seed bug class 5: FULL has landed, the SWA / MAMBA pages at its end are being fetched.
    No policy may stop the prefetch now (not best_effort when asked, not timeout past its
    deadline): it would hand back a hit missing a component, or lose it. Fails with the guard
    in ``prefetch_policy.can_terminate`` removed (the prefetch ends with 0 tokens)."""
    rig = Rig(tmp_path, POOL_SETS[pools])
    rig.write()
    aux_fp = rig.fp[POOL_SETS[pools][0]].digest.hex()
    gate = Gate(rig.store, lambda n, keys: keys[0].endswith(aux_fp))
    now = [0.0]
    ctl = rig.controller(gate, cfg(policy), clock=lambda: now[0])
    ctl.start("r", rig.hashes)
    assert gate.entered.wait(10)
    assert ctl._ops["r"].full_done and not ctl._ops["r"].worker_done
    now[0] += 1000.0  # far past the timeout budget
    for _ in range(5):
        assert ctl.poll() == (), "terminated while pool transfers were pending"
        ctl.check()
    assert ctl.stats().refused_pool_pending == 5
    gate.release()
    [r] = drive(ctl)
    assert (r.tokens, r.reason) == (64, "complete")
    rig.verify(r)
    rig.free(r)
    settle(ctl)
    assert rig.all_free()
    ctl.close()


def test_pool_transfer_is_all_or_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ("swa", "mamba"))
    rig.write()
    rig.store.delete(rig.fp["mamba"].keys(rig.hashes[-1:]))  # the state at the end is gone
    ctl = rig.controller(config=cfg())
    ctl.start("r", rig.hashes)
    [r] = drive(ctl)
    assert (r.tokens, r.reason, r.aux_slots[0][1].numel()) == (0, pe.R_POOL_TRANSFER, 0)
    settle(ctl)
    assert rig.all_free()
    assert ctl.stats().unfulfilled == {pe.R_POOL_TRANSFER: 64}
    assert ctl.stats().failed_pages == {"miss": 1}
    ctl.close()


def test_rate_limit_caps_the_host_share(tmp_path: Path) -> None:
    rig = Rig(tmp_path, n_pages=24)
    rig.write()
    gate = Gate(rig.store, lambda n, keys: True)  # hold everything: the slots stay taken
    ctl = rig.controller(gate, cfg(max_host_share=0.5))  # 32 of 64 host pages
    assert ctl.limit_tokens == HOST_PAGES * P // 2
    a = ctl.start("a", rig.hashes)                 # 24 pages
    b = ctl.start("b", rig.hashes)                 # clamped to the 8 pages left
    c = ctl.start("c", rig.hashes)                 # nothing left
    assert (a.tokens, b.tokens) == (96, 32)
    assert (c.started, c.reason) == (False, pe.R_RATE_LIMITED)
    assert ctl.occupied_tokens == 128
    gate.release()
    got = drive(ctl)
    while len(got) < 2:
        got += drive(ctl)
    for r in got:
        rig.verify(r)
        rig.free(r)
    settle(ctl)
    assert rig.all_free() and ctl.occupied_tokens == 0
    assert ctl.stats().declined == {pe.R_RATE_LIMITED: 1}
    ctl.close()


@pytest.mark.parametrize("pools", ["full", "full+swa+mamba"])
def test_abort_releases_everything(tmp_path: Path, pools: str) -> None:
    rig = Rig(tmp_path, POOL_SETS[pools])
    rig.write()
    gate = Gate(rig.store, lambda n, keys: n == 2)
    obs = ListObserver()
    ctl = rig.controller(gate, cfg(), observer=obs)
    ctl.start("r", rig.hashes)
    assert gate.entered.wait(10)
    assert ctl.abort("r") and not ctl.abort("r") and not ctl.ongoing("r")
    ctl.check()
    gate.release()
    settle(ctl)
    assert rig.all_free()
    assert obs.of(pe.PREFETCH_END)[0].attrs[pe.A_REASON] == pe.R_ABORTED
    assert ctl.stats().unfulfilled == {pe.R_ABORTED: 64}
    ctl.close()




FAULTS = {  # fault -> (FaultyBackend kwargs, applied to writes?, tokens kept, reason, failed page)
    "failure": ({"failure_rate": 1.0}, False, 0, "error", None),
    "timeout": ({"timeout_rate": 1.0}, False, 0, "timeout", None),
    "torn": ({"torn_rate": 1.0}, True, 0, "corrupt", "corrupt"),
    "stale_exists": ({"stale_exists_rate": 1.0}, False, 24, "miss", "miss"),
    "get_failure": ({"get_failure_rate": 1.0}, False, 0, "miss", "miss"),
}


@pytest.mark.parametrize("fault", list(FAULTS) + ["restart"])
@pytest.mark.parametrize("pools", ["full", "full+swa+mamba"])
def test_every_fault_is_a_value(tmp_path: Path, fault: str, pools: str) -> None:
    rig = Rig(tmp_path, POOL_SETS[pools])
    if fault == "restart":
        rig.write()
        faulty = FaultyBackend(rig.store)
        backend = Gate(faulty, lambda n, keys: bool(n == 2 and faulty.restart(1, True)))
        keep, reason, failed = 16, "error", "error"
    else:
        kw, on_write, keep, reason, failed = FAULTS[fault]
        faulty = FaultyBackend(rig.store, seed=1, **kw)
        if on_write:
            rig.write(faulty)
        else:
            rig.write(pages=6 if fault == "stale_exists" else None)
        backend = faulty
    ctl = rig.controller(backend, cfg())
    assert ctl.start("r", rig.hashes).started
    [r] = drive(ctl)
    if POOL_SETS[pools] and fault == "restart":  # came back empty: the pool pages at E are gone
        keep = 0
    assert (r.tokens, r.reason) == (keep, reason)
    rig.verify(r)
    settle(ctl)
    rig.free(r)
    assert rig.all_free(), "host slots leaked"
    st = ctl.stats()
    assert st.ended_by == {reason: 1}
    assert sum(st.unfulfilled.values()) == 64 - keep
    if failed:
        assert st.failed_pages.get(failed, 0) > 0
    assert sum(faulty.injected.values()) > 0
    ctl.close()


def test_failing_observer_is_counted_not_raised(tmp_path: Path) -> None:
    class Boom(ListObserver):
        def event(self, ev: tuple) -> None:
            raise RuntimeError("boom")

    rig = Rig(tmp_path)
    rig.write()
    ctl = rig.controller(config=cfg(), observer=Boom())
    ctl.start("r", rig.hashes)
    [r] = drive(ctl)
    assert r.tokens == 64 and ctl.observer_errors > 0
    rig.free(r)
    ctl.close()


def test_bad_input_raises_before_any_change(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    ctl = rig.controller(config=cfg())
    with pytest.raises(ValueError, match="digests"):
        ctl.start("r", [b"short"] * 4)
    with pytest.raises(TypeError):
        ctl.start("", rig.hashes)
    with pytest.raises(ValueError, match="policy|best_effort|valid"):
        PrefetchConfig(policy="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_host_share"):
        PrefetchConfig(max_host_share=0)
    assert rig.all_free() and not ctl._ops
    ctl.close()
