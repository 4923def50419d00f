"""The workload of ``bench_scale.py`` and the benches built on it (issue 17): long multi-turn
chat over shared system prompts, requests of ~1-3 k tokens, page size 1, each request driven as
SGLang's scheduler drives its cache (match -> lock -> evict when short -> alloc -> insert ->
unlock), every cache call timed on its own (``one_request``)."""

from __future__ import annotations

import random
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from radixscope.cache import CacheConfig, HiRadixCache, TokenKey  # noqa: E402

SCALES = {"1k": 1_000, "100k": 100_000}
SYS_LEN, TURN_MIN, TURN_MAX, CONV_MAX = 1024, 96, 320, 3072
TOKENS_PER_NODE = 216  # resident tokens per node on this workload (measured)
# requests fill in the branching points their match reports (``MatchResult.branch_len``), as
# SGLang's scheduler does: with SWA / MAMBA a conversation then reuses a shared system prompt
BRANCHING = True
CLOCK = time.thread_time_ns
STALL = 2_000  # requests with no new node count that end a fill short of its nodes (``fill``)


class Chat:
    """Active conversations over a few shared system prompts; each request is one of them
    extended by a turn. Conversations are kept as ``array('i')`` (the workload's own memory
    stays small and countable)."""

    def __init__(self, active: int, seed: int = 0, prompts: int = 8) -> None:
        self.rng = random.Random(seed)
        self.prompts = [array("i", [self.rng.randrange(1, 32000) for _ in range(SYS_LEN)])
                        for _ in range(prompts)]
        self.convs = [array("i", self.rng.choice(self.prompts)) for _ in range(active)]

    def next(self) -> TokenKey:
        r = self.rng
        i = r.randrange(len(self.convs))
        conv = self.convs[i]
        if len(conv) > CONV_MAX:
            conv = self.convs[i] = array("i", r.choice(self.prompts))
        conv.extend(array("i", [r.randrange(1, 32000)
                                for _ in range(r.randrange(TURN_MIN, TURN_MAX + 1))]))
        return TokenKey(conv)

    def nbytes(self) -> int:
        return sum(c.buffer_info()[1] * c.itemsize for c in self.convs + self.prompts)


def make_cache(nodes: int, components: tuple[str, ...], recorder,
               tokens_per_node: int = TOKENS_PER_NODE, window: int = 256) -> HiRadixCache:
    """A page-1 cache on the CPU, its device pools sized for ``nodes`` resident nodes of
    ``tokens_per_node`` tokens (no host tier; one-element KV, so the pools cost little memory);
    ``window``: the SWA window, and the MAMBA slots beyond one a node."""
    tokens = nodes * tokens_per_node
    kw = dict(page_size=1, device_tokens=tokens, host_tokens=0, components=components,
              layers=1, heads=1, head_dim=1, dtype=torch.float16, device="cpu")
    if "swa" in components:
        kw.update(sliding_window=window, swa_device_tokens=tokens, swa_host_tokens=0,
                  swa_layers=1)
    if "mamba" in components:
        kw.update(mamba_slots=nodes + window, mamba_host_slots=0, mamba_state_shape=(1,))
    return HiRadixCache(CacheConfig(**kw), recorder=recorder)


def fill(c: HiRadixCache, chat: Chat, nodes: int, each=None) -> int:
    """Run requests until the tree holds ``nodes`` resident nodes and its FULL device pool is
    full (under a fiftieth of it free); returns the requests run. ``each(i, calls)`` runs after
    request ``i`` (``one_request``'s count of cache calls).

    The pools are sized by ``TOKENS_PER_NODE``, a mean: a tree whose nodes run longer fills its
    pool short of ``nodes`` and never reaches it (at 200 nodes, 160-180). So the fill also ends once
    the pool is full and the node count has not passed its highest for ``max(STALL, nodes)``
    requests."""
    full = c.config.device_tokens // 50
    most = grew_at = i = 0
    while True:
        calls = one_request(c, chat.next(), None, f"w{i}")
        if each is not None:
            each(i, calls)
        i += 1
        n = len(c.tree.nodes) - 1
        if n > most:
            most, grew_at = n, i
        if c.available() <= full and (n >= nodes or i - grew_at >= max(STALL, nodes)):
            return i


def kv_bytes(c: HiRadixCache) -> int:
    return sum(p.buf.numel() * p.buf.element_size() for p in c.device_pools + c.host_pools)


def one_request(c: HiRadixCache, key: TokenKey, t: dict | None, rid: str) -> int:
    """One scheduled request; returns the cache calls it made. Each cache call is timed on its
    own (``evict`` / ``alloc`` per component: ``evict.swa``, ``alloc.mamba``...), the
    request's own tensor plumbing (the SWA index row) outside every timing."""
    clock = CLOCK
    comps = c.ci
    t0 = clock()
    m = c.match_prefix(key, req_id=rid)
    t1 = clock()
    r = c.lock(m.last_device_node, owner=rid)
    t2 = clock()
    n = len(key) - m.device_prefix_len
    calls = 5  # match, lock, alloc, insert, unlock; + every evict and auxiliary alloc
    timed = [] if t is not None else None
    short = n - c.available()
    if short > 0:
        e0 = clock()
        out = c.evict(short)
        e1 = clock()
        calls += 1
        if timed is not None:
            timed.append(("evict", e1 - e0))
            popped = set(out.evicted_nodes)
            t["victims"].append(len(popped | set(out.deleted)))
            t["asked"].append(short)
            t["ancestors"].append(len(set(out.deleted) - popped))  # the tombstone cascade's
    aux = []
    if "swa" in comps:
        aux.append(("swa", n))
        if n - c.available("swa") > 0:
            _timed_evict(c, n - c.available("swa"), "swa", timed)
            calls += 1
    branch = m.branch_len if BRANCHING else 0
    if "mamba" in comps:
        states = 2 if branch else 1  # the state at the key's end, and at the branching point
        aux.append(("mamba", states))
        if c.available("mamba") < states:
            _timed_evict(c, states - c.available("mamba"), "mamba", timed)
            calls += 1
    a0 = clock()
    idx = c.alloc(n)
    a1 = clock()
    kw = {}
    for comp, k in aux:
        b0 = clock()
        slots = c.alloc(k, component=comp)
        b1 = clock()
        if timed is not None:
            timed.append((f"alloc.{comp}", b1 - b0))
        if comp == "swa":
            kw["swa_indices"] = torch.cat([torch.full((m.device_prefix_len,), -1,
                                                      dtype=torch.int64), slots])
        else:
            kw["mamba_slot"] = slots[:1]
            if branch:
                kw["mamba_branch_slot"] = slots[1:]
    calls += len(aux)
    full = torch.cat([m.device_indices, idx])
    t4 = clock()
    c.insert(key, full, prev_prefix_len=m.device_prefix_len, branch_len=branch, req_id=rid, **kw)
    t5 = clock()
    c.unlock(r)
    t6 = clock()
    if t is not None:
        t["match"].append(t1 - t0)
        t["lock"].append(t2 - t1)
        t["alloc"].append(a1 - a0)
        for op, ns in timed:
            t.setdefault(op, []).append(ns)
        t["insert"].append(t5 - t4)
        t["unlock"].append(t6 - t5)
        t["request"].append(t6 - t5 + t5 - t4 + t2 - t0)
        t["hit"].append(m.device_prefix_len / max(1, len(key)))
        t7 = clock()  # the match's device path depth: left out of the batch's CPU time too
        t["depth"].append(len(c.tree.path_to_root(c.node(m.last_device_node))))
        t["aside"].append(clock() - t7)
    return calls


def _timed_evict(c: HiRadixCache, k: int, comp: str, timed: list | None) -> None:
    e0 = CLOCK()
    c.evict(k, component=comp)
    if timed is not None:
        timed.append((f"evict.{comp}", CLOCK() - e0))
