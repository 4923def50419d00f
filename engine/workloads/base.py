"""What every workload shares: a seeded token source and the arrival helpers.

A workload is a function ``generate(n, seed, **options) -> list[RequestSpec]``: deterministic for
a given seed (same requests, same tokens, same arrivals), with exactly ``n`` requests.
"""

from __future__ import annotations

import random

import torch

VOCAB = 32000


class Tokens:
    """Seeded random token ids and lengths (one ``torch.Generator`` plus one ``random.Random``)."""

    def __init__(self, seed: int, vocab: int = VOCAB) -> None:
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab

    def ids(self, n: int) -> tuple[int, ...]:
        """``n`` token ids in ``[0, vocab)``."""
        if n <= 0:
            return ()
        return tuple(torch.randint(0, self.vocab, (n,), generator=self.gen).tolist())

    def length(self, lo: int, hi: int) -> int:
        """A length in ``[lo, hi]``."""
        return self.rng.randint(lo, hi)

    def zipf_index(self, n: int, s: float = 1.1) -> int:
        """An index in ``[0, n)`` drawn with Zipf-like popularity (0 the most popular)."""
        weights = [1.0 / (k + 1) ** s for k in range(n)]
        return self.rng.choices(range(n), weights=weights)[0]


def spread(rng: random.Random, n: int, mean_gap: float) -> list[int]:
    """``n`` arrival steps of a Poisson process with ``mean_gap`` steps between arrivals."""
    out, t = [], 0.0
    for _ in range(n):
        out.append(int(t))
        t += rng.expovariate(1.0 / mean_gap) if mean_gap > 0 else 0.0
    return out


def check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"requests={n!r}: must be an int >= 1")
