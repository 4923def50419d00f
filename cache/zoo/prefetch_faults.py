"""Zoo fault in the L3 prefetch: a prefetch terminated while its pool transfers are pending
(class 6, seed 004). Installed on one ``PrefetchController`` instance; not reachable from an
engine run yet (the engine has no L3 tier wired: see docs/zoo.md)."""

from __future__ import annotations

import dataclasses

from radixscope.cache.storage.prefetch_policy import LocalView, StopPolicy, can_terminate
from radixscope.cache.zoo import Fault


def _can_terminate_pre_fix(policy: StopPolicy, view: LocalView) -> tuple[bool, str]:
    """SGLang's ``can_terminate_prefetch`` before the HiMamba fix: FULL complete means done,
    whatever the pool transfers aligned to it are doing (the fixed rule, blind to them)."""
    blind = dataclasses.replace(view, has_pools=False,
                                worker_done=view.worker_done or view.full_complete)
    return can_terminate(policy, blind)


def _install(ctl, inj) -> None:
    """The controller's vote uses the pre-fix rule; each ``poll`` counts as one operation."""
    orig_poll = ctl.poll
    inj.polls = 0

    def vote(policy, view):
        ok, why = _can_terminate_pre_fix(policy, view)
        if ok and view.pool_pending:
            inj.fire("voted to stop a prefetch whose pool transfers are pending", (),
                     op_id=inj.polls)
        return ok, why

    def poll():
        inj.polls += 1
        return orig_poll()
    ctl._can_terminate = vote
    ctl.poll = poll


FAULTS = (
    Fault("prefetch_pool_pending", 6, "a prefetch terminated while its pool transfers are "
          "pending", "seed 004 (SGLang HiMamba can_terminate_prefetch fix; PR #27264 context)",
          "the stop vote treats FULL-complete as complete (pre-fix can_terminate_prefetch)",
          "the controller's stop commit re-checks the rule: prefetch.terminated_pool_pending "
          "(new)", _install, target="prefetch"),
)
