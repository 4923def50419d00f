"""Random prompts: independent random token sequences, some of them resubmitted.

Each request is fresh random tokens, except that with probability ``resubmit`` it starts with a
random-length prefix of an earlier prompt (a retry or an edited resubmission), so the cache sees
occasional reuse of arbitrary, partly evicted prefixes.
"""

from __future__ import annotations

from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads.base import Tokens, check_count, spread


def generate(n: int, seed: int = 0, *, prompt_len: tuple[int, int] = (64, 768),
             answer_len: tuple[int, int] = (8, 64), resubmit: float = 0.4,
             mean_gap: float = 2.0) -> list[RequestSpec]:
    """``n`` random requests arriving every ``mean_gap`` steps on average."""
    check_count(n)
    tok = Tokens(seed + 3)
    arrivals = spread(tok.rng, n, mean_gap)
    prompts: list[tuple[int, ...]] = []
    out = []
    for i in range(n):
        length = tok.length(*prompt_len)
        if prompts and tok.rng.random() < resubmit:
            base = prompts[tok.rng.randrange(len(prompts))]
            keep = tok.rng.randint(len(base) // 2, len(base))
            prompt = base[:keep] + tok.ids(max(1, length - keep))
        else:
            prompt = tok.ids(length)
        prompts.append(prompt)
        answer = tok.ids(tok.length(*answer_len))
        out.append(RequestSpec(f"random-{i}", prompt + answer, len(prompt), arrival=arrivals[i],
                               kind="random"))
    return out
