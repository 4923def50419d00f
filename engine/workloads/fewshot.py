"""Few-shot prompting: a handful of tasks, each a fixed block of worked examples, then a query.

Many independent requests share a task's example block (popularity is Zipf-like), so the block
stays hot while rarely used tasks age out of device memory and come back from host.
"""

from __future__ import annotations

from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads.base import Tokens, check_count, spread


def generate(n: int, seed: int = 0, *, tasks: int = 8, examples: tuple[int, int] = (4, 8),
             example_len: tuple[int, int] = (48, 128), query_len: tuple[int, int] = (16, 64),
             answer_len: tuple[int, int] = (4, 32), mean_gap: float = 1.5) -> list[RequestSpec]:
    """``n`` few-shot requests arriving every ``mean_gap`` steps on average."""
    check_count(n)
    tok = Tokens(seed + 2)
    blocks = []
    for _ in range(tasks):
        block: tuple[int, ...] = ()
        for _ in range(tok.length(*examples)):
            block += tok.ids(tok.length(*example_len))
        blocks.append(block)
    arrivals = spread(tok.rng, n, mean_gap)
    out = []
    for i in range(n):
        task = tok.zipf_index(tasks, 0.9)
        prompt = blocks[task] + tok.ids(tok.length(*query_len))
        answer = tok.ids(tok.length(*answer_len))
        out.append(RequestSpec(f"fewshot-{i}", prompt + answer, len(prompt), arrival=arrivals[i],
                               kind="fewshot"))
    return out
