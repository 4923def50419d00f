"""Agentic loops: a shared tool-description preamble, then act / observe iterations.

Each iteration's prompt is the whole history so far plus the last tool output (long, growing
contexts); its output is the next action. The next iteration arrives when the tool returns
(a few steps after the previous one finished).
"""

from __future__ import annotations

from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads.base import Tokens, check_count, spread


def generate(n: int, seed: int = 0, *, preambles: int = 2,
             preamble_len: tuple[int, int] = (384, 640),
             task_len: tuple[int, int] = (48, 128), iterations: tuple[int, int] = (3, 10),
             action_len: tuple[int, int] = (16, 48), tool_len: tuple[int, int] = (32, 224),
             tool_time: tuple[int, int] = (2, 12), mean_gap: float = 8.0) -> list[RequestSpec]:
    """``n`` agent steps, a new agent every ``mean_gap`` steps on average. With the defaults a
    context stays under 3,500 tokens, so it fits the presets' 4,096-token device pools."""
    check_count(n)
    tok = Tokens(seed + 1)
    shared = [tok.ids(tok.length(*preamble_len)) for _ in range(preambles)]
    out: list[RequestSpec] = []
    agent = 0
    starts = iter(spread(tok.rng, n, mean_gap))
    while len(out) < n:
        context = shared[agent % preambles] + tok.ids(tok.length(*task_len))
        k = min(tok.length(*iterations), n - len(out))
        prev = None
        start = next(starts)
        for i in range(k):
            action = tok.ids(tok.length(*action_len))
            rid = f"agent-{agent}-{i}"
            out.append(RequestSpec(rid, context + action, len(context),
                                   arrival=start if prev is None else 0, after=prev,
                                   delay=0 if prev is None else tok.length(*tool_time),
                                   kind="agentic"))
            context = context + action + tok.ids(tok.length(*tool_len))  # tool observation
            prev = rid
        agent += 1
    return out
