"""Requests: the immutable spec a workload produces, and the engine's mutable per-request state.

A spec carries the whole token sequence (prompt, then the output the stand-in model "generates":
decoding is teacher-forced, so later turns of a conversation can contain earlier outputs), when
it arrives (an engine step, or a number of steps after another request finished) and its
namespace. ``Sequence`` is what the engine tracks while the request runs: the slots it owns, its
lock receipt, how much of it the tree owns, and its span.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixscope.cache.keys import TokenKey

# phases of a running request
QUEUED = "queued"
PREFILL = "prefill"
DECODE = "decode"
FINISHED = "finished"
REJECTED = "rejected"


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload.

    Attributes:
        rid: unique request id.
        tokens: prompt followed by output token ids.
        prompt_len: tokens of ``tokens`` that are the prompt (>= 1).
        arrival: engine step at which it arrives (after ``after`` finished, if set).
        after: id of a request that must finish first (the previous turn), or None.
        delay: steps after ``after`` finished before it arrives (think time).
        extra_key: cache namespace (LoRA id, cache salt), or None.
        kind: workload tag (``chat``, ``agentic``...), for reports.
    """

    rid: str
    tokens: tuple[int, ...]
    prompt_len: int
    arrival: int = 0
    after: str | None = None
    delay: int = 0
    extra_key: str | None = None
    kind: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.prompt_len <= len(self.tokens):
            raise ValueError(f"request {self.rid}: prompt_len={self.prompt_len} must be in "
                             f"[1, {len(self.tokens)}]")
        if self.arrival < 0 or self.delay < 0:
            raise ValueError(f"request {self.rid}: arrival={self.arrival} and "
                             f"delay={self.delay} must be >= 0")

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.tokens[:self.prompt_len]


@dataclass
class Sequence:
    """A request while the engine runs it. Positions ``[0, cached_len)`` belong to the tree (the
    request holds a lock on them); FULL slots ``[cached_len, seq_len)`` and SWA slots
    ``[max(cached_len, swa_evicted_len), seq_len)`` belong to the request."""

    spec: RequestSpec
    hashes: torch.Tensor  # [len(tokens), 2] prefix hashes (the model's input)
    phase: str = QUEUED
    arrived_step: int = 0
    admitted_step: int = -1
    seq_len: int = 0  # positions with KV written
    cached_len: int = 0  # positions owned by the tree
    full: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    swa: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    swa_evicted_len: int = 0
    mamba_slot: torch.Tensor | None = None
    # a branching point to fill in (``MatchResult.branch_len``) at the first checkpoint that
    # reaches it; 0: none (or filled)
    branch_len: int = 0
    receipt: object = None  # radixscope.cache.results.LockReceipt
    anchor: int = 0  # the node the lock is anchored on
    span: object = None  # the request's OTel span
    attempts: int = 0  # admission attempts
    refusals: int = 0
    retractions: int = 0
    chunks: int = 0
    device_hit: int = 0  # FULL prefix tokens reused from device at admission
    host_hit: int = 0  # FULL prefix tokens loaded back from host
    storage_hit: int = 0  # of host_hit, tokens an L3 prefetch brought to host
    prefetch_status: str = "off"  # the L3 prefetch at arrival (MatchResult.prefetch_status)
    swa_loaded: int = 0
    mamba_loaded: int = 0
    mamba_device_hit: int = 0
    first_reason: str = ""  # the first refusal (or the rejection)
    last_reason: str = ""  # the latest refusal
    # the whole token sequence, validated once: every match and insert passes a slice of it
    # (a buffer copy), not a slice of ``spec.tokens`` the cache would validate int by int again
    key: TokenKey = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.key = TokenKey(self.spec.tokens)

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def total_len(self) -> int:
        return len(self.spec.tokens)

    @property
    def prompt_len(self) -> int:
        return self.spec.prompt_len

    @property
    def reused(self) -> int:
        return self.device_hit + self.host_hit


__all__ = ["RequestSpec", "Sequence", "QUEUED", "PREFILL", "DECODE", "FINISHED", "REJECTED"]
