"""Multi-turn chat: a few shared system prompts, conversations whose turns grow the context.

Turn ``k`` of a conversation is ``system + user_1 + answer_1 + ... + user_k`` and its output is
``answer_k``; it arrives a few steps (think time) after turn ``k - 1`` finished, so its prompt
extends what the previous turn cached. Meanwhile other conversations push it out of device
memory, so later turns exercise host backup and load-back.
"""

from __future__ import annotations

from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads.base import Tokens, check_count, spread


def generate(n: int, seed: int = 0, *, system_prompts: int = 4,
             system_len: tuple[int, int] = (192, 448),
             turns: tuple[int, int] = (3, 8), user_len: tuple[int, int] = (16, 96),
             answer_len: tuple[int, int] = (16, 64), think: tuple[int, int] = (4, 40),
             mean_gap: float = 3.0) -> list[RequestSpec]:
    """``n`` chat requests (turns), conversations started every ``mean_gap`` steps on average."""
    check_count(n)
    tok = Tokens(seed)
    systems = [tok.ids(tok.length(*system_len)) for _ in range(system_prompts)]
    out: list[RequestSpec] = []
    conv = 0
    starts = iter(spread(tok.rng, n, mean_gap))
    while len(out) < n:
        sys_prompt = systems[tok.zipf_index(system_prompts)]
        k = min(tok.length(*turns), n - len(out))
        context: tuple[int, ...] = sys_prompt
        prev = None
        start = next(starts)
        for t in range(k):
            prompt = context + tok.ids(tok.length(*user_len))
            answer = tok.ids(tok.length(*answer_len))
            rid = f"chat-{conv}-{t}"
            out.append(RequestSpec(rid, prompt + answer, len(prompt),
                                   arrival=start if prev is None else 0, after=prev,
                                   delay=0 if prev is None else tok.length(*think), kind="chat"))
            context = prompt + answer
            prev = rid
        conv += 1
    return out
