"""Hybrid fidelity benchmark (issue 14): FULL-only vs FULL+SWA on one multi-turn chat workload.

Long multi-turn conversations over shared system prompts; requests of about 1-3 k tokens; page
size 1; the FULL device pool sized so about 1,000 nodes stay resident (222 k tokens); the SWA
pool half the FULL pool; window 1024; no host tier. Each batch of live sequences is driven as
SGLang's scheduler drives its cache:

- prefill: match -> lock ``last_device_node`` -> evict when short -> alloc (FULL, SWA) ->
  insert the prompt -> lock the new node, unlock the old one;
- decode (in steps of ``--step`` tokens): evict when short -> alloc; SWA slots that left the
  window are freed and the lock's window is released (``release_swa``) once the tree's part of
  it is out of the window;
- finish: insert prompt + output (``swa_evicted_len`` = what decode freed) -> free the unaligned
  rest -> unlock.

Reports per component set: token hit rate (device prefix / prompt tokens), resident FULL tokens
and nodes (mean over the second half of the run), resident SWA tokens per live sequence (SWA
device slots pinned by the live sequences' locks or held by them, mean over decode steps), and
cache ops/s (wall clock).

    python bench/bench_hybrid.py            # the issue's sizes (710 conversations)
    python bench/bench_hybrid.py --quick    # tokens / 10 (pools, window, requests), 142 convs
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from radixscope.cache import CacheConfig, HiRadixCache  # noqa: E402

_NONE = torch.empty(0, dtype=torch.int64)


@dataclass(frozen=True)
class Shape:
    conversations: int = 710
    prompts: int = 16            # shared system prompts
    sys_len: int = 600
    user: tuple[int, int] = (150, 350)
    answer: tuple[int, int] = (100, 300)
    max_len: int = 3000          # a conversation ends once a request would pass this
    live: int = 16               # sequences decoded together
    open_convs: int = 48         # conversations waiting for their next turn
    full_tokens: int = 222_000
    window: int = 1024

    @staticmethod
    def quick() -> Shape:
        return Shape(conversations=142, prompts=4, sys_len=60, user=(15, 35), answer=(10, 30),
                     max_len=300, full_tokens=22_200, window=102)


@dataclass
class Seq:
    conv: int
    tokens: list[int]            # prompt + output
    prompt_len: int
    full: torch.Tensor = _NONE
    swa: torch.Tensor = _NONE
    cached: int = 0
    swa_ev: int = 0
    receipt: object = None


@dataclass
class Stats:
    prompt_tokens: int = 0
    hit_tokens: int = 0
    requests: int = 0
    ops: int = 0
    full_samples: list[int] = field(default_factory=list)
    node_samples: list[int] = field(default_factory=list)
    swa_per_seq: list[float] = field(default_factory=list)


class Workload:
    """Deterministic conversations: each turn = history + a user message; the answer follows."""

    def __init__(self, shape: Shape, seed: int, order: str = "fifo") -> None:
        self.s = shape
        self.order = order
        self.rng = random.Random(seed)
        self.prompts = [[self.rng.randrange(1, 50_000) for _ in range(shape.sys_len)]
                        for _ in range(shape.prompts)]
        self.started = 0
        self.open: dict[int, list[int]] = {}

    def _start(self) -> None:
        self.open[self.started] = list(self.rng.choice(self.prompts))
        self.started += 1

    def batch(self) -> list[tuple[int, list[int], int]]:
        """Up to ``live`` requests from distinct open conversations, the longest-waiting first
        (each user replies once the answer is back, and replies queue in arrival order):
        (conv, prompt, answer len)."""
        r, s = self.rng, self.s
        while len(self.open) < s.open_convs and self.started < s.conversations:
            self._start()
        out = []
        waiting = list(self.open)  # in arrival order: the longest-waiting conversations first
        if self.order == "random":  # or any of them, so some wait many batches
            waiting = r.sample(waiting, min(s.live, len(waiting)))
        for cid in waiting[:s.live]:
            hist = self.open.pop(cid)
            prompt = hist + [r.randrange(1, 50_000) for _ in range(r.randint(*s.user))]
            out.append((cid, prompt, r.randint(*s.answer)))
        return out

    def finish(self, cid: int, tokens: list[int]) -> None:
        if len(tokens) + self.s.user[1] + self.s.answer[1] <= self.s.max_len:
            self.open[cid] = tokens  # the user's next turn queues behind the others
        # else the conversation is over


class Runner:
    def __init__(self, shape: Shape, swa: bool, step: int) -> None:
        self.s, self.swa, self.step = shape, swa, step
        kw = dict(page_size=1, device_tokens=shape.full_tokens, host_tokens=0,
                  components=("full", "swa") if swa else ("full",), layers=1, heads=1,
                  head_dim=2, dtype=torch.float16, device="cpu")
        if swa:
            kw.update(sliding_window=shape.window, swa_device_tokens=shape.full_tokens // 2,
                      swa_host_tokens=0, swa_layers=1)
        self.c = HiRadixCache(CacheConfig(**kw))
        self.st = Stats()

    # ---- cache calls (counted) ---------------------------------------------------------------
    def call(self, name: str, *a, **kw):
        self.st.ops += 1
        return getattr(self.c, name)(*a, **kw)

    def take(self, n: int, comp: str) -> torch.Tensor:
        short = n - self.c.available(comp)
        if short > 0:  # evict when short, as the scheduler does
            self.call("evict", short, component=comp)
        return self.call("alloc", n, component=comp)

    def insert(self, q: Seq, upto: int):
        kw = {}
        if self.swa:
            kw = {"swa_indices": q.swa[:upto], "swa_evicted_len": q.swa_ev}
        return self.call("insert", q.tokens[:upto], q.full[:upto], prev_prefix_len=q.cached,
                         **kw)

    def relock(self, q: Seq, node: int) -> None:
        new = self.call("lock", node)
        if q.receipt is not None:
            self.call("unlock", q.receipt)
        q.receipt = new
        path = self.c.path_indices(node)
        q.full = torch.cat([path, q.full[path.numel():]])
        if self.swa:
            q.swa = q.swa.clone()
            q.swa[:path.numel()] = -1  # the tree took or freed these
        q.cached = path.numel()

    # ---- one batch ---------------------------------------------------------------------------
    def prefill(self, cid: int, prompt: list[int]) -> Seq:
        q = Seq(cid, list(prompt), len(prompt))
        m = self.call("match_prefix", prompt)
        self.st.prompt_tokens += len(prompt)
        self.st.hit_tokens += m.device_prefix_len
        q.receipt = self.call("lock", m.last_device_node)
        p, n = m.device_prefix_len, len(prompt)
        q.full = torch.cat([m.device_indices, self.take(n - p, "full")])
        if self.swa:
            q.swa = torch.cat([torch.full((p,), -1, dtype=torch.int64), self.take(n - p, "swa")])
        q.cached = p
        res = self.insert(q, n)
        self.relock(q, res.last_node)
        self.slide(q)
        return q

    def slide(self, q: Seq) -> None:
        if not self.swa:
            return
        seq_len = q.full.numel()
        new_ev = max(0, seq_len - self.s.window)
        lo = max(q.swa_ev, q.cached)
        if new_ev > lo:
            self.call("free", q.swa[lo:new_ev], component="swa")
            q.swa = q.swa.clone()
            q.swa[lo:new_ev] = -1
        q.swa_ev = max(q.swa_ev, new_ev)
        r = q.receipt
        if not r.swa_released and seq_len - self.s.window + 1 >= q.cached:
            q.receipt = self.call("release_swa", r)

    def decode(self, q: Seq, n: int, answer: list[int]) -> None:
        q.full = torch.cat([q.full, self.take(n, "full")])
        if self.swa:
            q.swa = torch.cat([q.swa, self.take(n, "swa")])
        q.tokens.extend(answer[:n])
        del answer[:n]
        self.slide(q)

    def finish(self, q: Seq) -> None:
        self.insert(q, len(q.tokens))
        self.call("unlock", q.receipt)
        q.receipt = None

    def run_batch(self, wl: Workload, r: random.Random) -> int:
        reqs = wl.batch()
        if not reqs:
            return 0
        seqs = [self.prefill(cid, prompt) for cid, prompt, _ in reqs]
        answers = [[r.randrange(1, 50_000) for _ in range(a)] for _, _, a in reqs]
        while any(answers):
            for q, ans in zip(seqs, answers, strict=True):
                if ans:
                    self.decode(q, min(self.step, len(ans)), ans)
            if self.swa:
                si = self.c.ci["swa"]
                live = self.c.protected[si][0] + self.c.request_held[si][0]
                self.st.swa_per_seq.append(live / len(seqs))
        for q in seqs:
            self.finish(q)
            wl.finish(q.conv, q.tokens)
        self.st.requests += len(seqs)
        return len(seqs)

    def run(self, seed: int, check: bool, order: str = "fifo") -> dict:
        wl = Workload(self.s, seed, order)
        r = random.Random(seed + 1)
        t0 = time.perf_counter()
        batches = []
        while self.run_batch(wl, r):
            batches.append(self.c.evictable[0][0] + self.c.protected[0][0])
            self.st.node_samples.append(len(self.c.tree.nodes) - 1)
            if check:
                self.c.check()
        wall = time.perf_counter() - t0
        half = len(batches) // 2
        st = self.st
        return {
            "components": "FULL+SWA" if self.swa else "FULL",
            "requests": st.requests,
            "hit_rate": round(st.hit_tokens / max(1, st.prompt_tokens), 4),
            "resident_full_tokens": round(sum(batches[half:]) / max(1, len(batches) - half)),
            "resident_nodes": round(sum(st.node_samples[half:])
                                    / max(1, len(st.node_samples) - half)),
            "swa_per_live_seq": (round(sum(st.swa_per_seq) / len(st.swa_per_seq))
                                 if st.swa_per_seq else None),
            "ops": st.ops,
            "ops_per_s": round(st.ops / wall),
            "wall_s": round(wall, 2),
        }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tokens / 10 (pools, window, requests), 142 conversations (tests)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step", type=int, default=32, help="decode tokens per step")
    ap.add_argument("--check", action="store_true", help="cache.check() after every batch")
    ap.add_argument("--order", choices=("fifo", "random"), default="fifo",
                    help="which waiting conversations continue: longest-waiting first (fifo) "
                         "or a random pick among the waiting ones")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    shape = Shape.quick() if a.quick else Shape()
    rows = [Runner(shape, swa, a.step).run(a.seed, a.check, a.order) for swa in (False, True)]
    full, hyb = rows
    summary = {"hit_rate_gap_points": round(100 * (full["hit_rate"] - hyb["hit_rate"]), 2),
               "resident_full_ratio": round(hyb["resident_full_tokens"]
                                            / max(1, full["resident_full_tokens"]), 3)}
    if a.json:
        print(json.dumps({"rows": rows, "summary": summary}))
    else:
        cols = ("components", "requests", "hit_rate", "resident_full_tokens", "resident_nodes",
                "swa_per_live_seq", "ops", "ops_per_s", "wall_s")
        print(" | ".join(cols))
        for row in rows:
            print(" | ".join(str(row[c]) for c in cols))
        print(summary)
    return rows


if __name__ == "__main__":
    main()
