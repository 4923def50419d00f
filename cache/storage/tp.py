"""Tensor-parallel agreement behind one tiny interface: integer all-reduce, MIN or MAX.

Prefetch decisions (how many pages exist, how many landed, may it stop) must be identical on
every rank, and every rank must call every collective in the same order whatever its local
state -- a rank that skips one deadlocks the others (SGLang #30760, #26921). ``SingleRank`` is
the no-op for one process; ``TorchRankGroup`` wraps a ``torch.distributed`` process group (gloo
on CPU). A group is used from one thread only: the prefetch controller takes two, one for its
scheduler-side calls and one for its worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class RankGroup(Protocol):
    """What the prefetch controller needs of a tensor-parallel group."""

    @property
    def world_size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    def all_reduce(self, values: Sequence[int], op: str) -> list[int]:
        """Element-wise ``"min"`` or ``"max"`` of ``values`` over every rank (same length on
        every rank)."""
        ...


class SingleRank:
    """One process: every reduction is the identity."""

    world_size = 1
    rank = 0

    def all_reduce(self, values: Sequence[int], op: str) -> list[int]:
        if op not in ("min", "max"):
            raise ValueError(f"op={op!r}: must be 'min' or 'max'")
        return [int(v) for v in values]


class TorchRankGroup:
    """A ``torch.distributed`` group (``None``: the default group). Counts its collectives."""

    def __init__(self, group: object | None = None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialized")
        self._dist = dist
        self.group = group
        self.calls = 0

    @classmethod
    def new(cls, backend: str = "gloo") -> TorchRankGroup:
        """A fresh group over every rank (collective: every rank must call it)."""
        import torch.distributed as dist

        return cls(dist.new_group(backend=backend))

    @property
    def world_size(self) -> int:
        return int(self._dist.get_world_size(self.group))

    @property
    def rank(self) -> int:
        return int(self._dist.get_rank(self.group))

    def all_reduce(self, values: Sequence[int], op: str) -> list[int]:
        if op not in ("min", "max"):
            raise ValueError(f"op={op!r}: must be 'min' or 'max'")
        t = torch.tensor([int(v) for v in values] or [0], dtype=torch.int64)
        red = self._dist.ReduceOp.MIN if op == "min" else self._dist.ReduceOp.MAX
        self._dist.all_reduce(t, op=red, group=self.group)
        self.calls += 1
        return t.tolist()[:len(values)]
