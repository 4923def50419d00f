"""Zoo fault in the L3 prefetch: a prefetch terminated while its pool transfers are pending
(class 6, seed 004). Installed on one ``HiRadixCache`` with an L3 tier (``--inject`` on a run
with ``--storage`` and a SWA or MAMBA component: the fault goes on the cache's
``PrefetchController``) or on a bare ``PrefetchController``."""

from __future__ import annotations

import dataclasses
import time

from radixscope.cache.storage.prefetch_policy import LocalView, StopPolicy, can_terminate
from radixscope.cache.zoo import Fault

# How long a pool-page read takes under the fault: what a remote store (redis, mooncake) costs
# for the SWA window / MAMBA state at the hit end. A local file store answers in microseconds,
# so an engine's poll would rarely meet the pool stage running; with this latency every
# prefetch of the run has a pool stage that the next polls see pending, as they did in SGLang.
POOL_READ_S = 0.05


def _can_terminate_pre_fix(policy: StopPolicy, view: LocalView) -> tuple[bool, str]:
    """SGLang's ``can_terminate_prefetch`` before the HiMamba fix: FULL complete means done,
    whatever the pool transfers aligned to it are doing (the fixed rule, blind to them)."""
    blind = dataclasses.replace(view, has_pools=False,
                                worker_done=view.worker_done or view.full_complete)
    return can_terminate(policy, blind)


def _slow_pool_reads(worker, seconds: float) -> None:
    """Give the worker's pool-page reads a remote store's latency (before each pool read)."""
    orig = worker._fetch_pool

    def fetch_pool(op, pool, slots, end):
        time.sleep(seconds)
        return orig(op, pool, slots, end)
    worker._fetch_pool = fetch_pool


def _install(obj, inj) -> None:
    """The controller's vote uses the pre-fix rule. On a bare controller each ``poll`` counts
    as one operation; on a cache the firing is the cache's op (the ``prefetch`` poll) and the
    pool reads get ``POOL_READ_S`` of latency.

    Raises:
        ValueError: a cache without an L3 tier, or whose prefetch fetches no pool (FULL only).
    """
    on_cache = hasattr(obj, "prefetcher")
    ctl = obj.prefetcher if on_cache else obj
    if ctl is None or not ctl.aux:
        raise ValueError("prefetch_pool_pending needs an L3 tier (--storage) and a SWA or MAMBA "
                         "component (pool transfers after FULL); this cache has "
                         + ("no L3 tier" if ctl is None else "FULL only"))
    inj.polls = 0

    def vote(policy, view):
        ok, why = _can_terminate_pre_fix(policy, view)
        if ok and view.pool_pending:
            inj.fire("voted to stop a prefetch whose pool transfers are pending",
                     op_id=None if on_cache else inj.polls)
        return ok, why
    ctl._can_terminate = vote
    if on_cache:
        _slow_pool_reads(ctl._worker, POOL_READ_S)
        return
    orig_poll = ctl.poll

    def poll():
        inj.polls += 1
        return orig_poll()
    ctl.poll = poll


FAULTS = (
    Fault("prefetch_pool_pending", 6, "a prefetch terminated while its pool transfers are "
          "pending", "seed 004 (SGLang HiMamba can_terminate_prefetch fix; PR #27264 context)",
          "the stop vote treats FULL-complete as complete (pre-fix can_terminate_prefetch)",
          "the controller's stop commit re-checks the rule: prefetch.terminated_pool_pending "
          "(new)", _install, targets=("cache", "prefetch"), needs_storage=True),
)
