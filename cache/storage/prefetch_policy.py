"""Prefetch configuration and the one stop rule (local half; the TP vote is in ``prefetch``).

``can_terminate`` is a pure function of what one rank sees. The rule that matters most (seed bug
class 5, SGLang's HiMamba hang): **a prefetch is never terminated while its pool transfers are
pending** -- once the FULL pages have all landed, the SWA / MAMBA pages aligned to that end are
about to be (or being) fetched, and stopping then would hand out a hit with missing components
or free host slots a transfer still writes. Every policy, ``best_effort`` included, waits for them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class StopPolicy(str, enum.Enum):
    """When a waiting request may stop its prefetch and proceed with what landed."""

    BEST_EFFORT = "best_effort"      # whenever the scheduler asks
    WAIT_COMPLETE = "wait_complete"  # only once every page found in storage has landed
    TIMEOUT = "timeout"              # complete, or past base + per-page budget


@dataclass(frozen=True)
class PrefetchConfig:
    """Prefetch settings (SGLang's defaults).

    Attributes:
        policy: the stop policy.
        threshold_tokens: below this many (page-aligned) tokens past the host match, and below
            this many tokens found in storage, no prefetch runs.
        timeout_base_s / timeout_per_ki_token_s: the ``timeout`` budget,
            ``base + pages * page_size / 1024 * per_ki_token``.
        max_host_share: the most of the FULL host pool that running prefetches may hold (rate
            limit); a prefetch is clamped to what is left, or declined below the threshold.
        batch_pages: pages per ``batch_get`` call of the worker (progress is per batch).
    """

    policy: StopPolicy = StopPolicy.TIMEOUT
    threshold_tokens: int = 256
    timeout_base_s: float = 1.0
    timeout_per_ki_token_s: float = 0.25
    max_host_share: float = 0.5
    batch_pages: int = 128

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", StopPolicy(self.policy))
        if not isinstance(self.threshold_tokens, int) or self.threshold_tokens < 0:
            raise ValueError(f"threshold_tokens={self.threshold_tokens!r}: must be an int >= 0")
        for name in ("timeout_base_s", "timeout_per_ki_token_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name}={v!r}: must be a number >= 0")
        if not isinstance(self.max_host_share, (int, float)) or not 0 < self.max_host_share <= 1:
            raise ValueError(f"max_host_share={self.max_host_share!r}: must be in (0, 1]")
        if not isinstance(self.batch_pages, int) or self.batch_pages < 1:
            raise ValueError(f"batch_pages={self.batch_pages!r}: must be an int >= 1")

    def budget_s(self, pages: int, page_size: int) -> float:
        """The ``timeout`` policy's budget for a prefetch of ``pages`` pages."""
        return self.timeout_base_s + pages * page_size / 1024 * self.timeout_per_ki_token_s


@dataclass(frozen=True)
class LocalView:
    """What one rank knows of one prefetch when the scheduler polls it.

    Attributes:
        worker_done: the worker has finished every stage (FULL, pools, its collectives).
        full_complete: every page storage reported (agreed count) has landed on this rank.
        has_pools: the prefetch fetches SWA / MAMBA pages after FULL.
        elapsed_s / budget_s: time since start and the ``timeout`` budget.
    """

    worker_done: bool
    full_complete: bool
    has_pools: bool
    elapsed_s: float
    budget_s: float

    @property
    def pool_pending(self) -> bool:
        """FULL has landed and the pool transfers aligned to it have not finished."""
        return self.has_pools and self.full_complete and not self.worker_done


def can_terminate(policy: StopPolicy, view: LocalView) -> tuple[bool, str]:
    """This rank's vote: may the prefetch stop now? Returns ``(ok, reason)``.

    ``reason`` names why it may stop (``complete``, ``terminated``, ``deadline``) or why not
    (``pool_pending``, ``incomplete``).
    """
    if view.pool_pending:  # the guard (bug class 5): never while pool transfers are pending
        return False, "pool_pending"
    if view.worker_done:
        return True, "complete"
    if policy is StopPolicy.BEST_EFFORT:
        return True, "terminated"
    if policy is StopPolicy.TIMEOUT and view.elapsed_s > view.budget_s:
        return True, "deadline"
    return False, "incomplete"
