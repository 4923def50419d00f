"""Test kit: configs for the four component sets, content that is a function of the token
prefix, and a small request driver that inserts keys the way an engine does."""

from __future__ import annotations

import random

import pytest
import torch

from radixscope.cache import CacheConfig, HiRadixCache
from radixscope.cache.errors import CacheOutOfMemory
from radixscope.cache.tiers import Tier

COMBOS = [("full",), ("full", "swa"), ("full", "mamba"), ("full", "swa", "mamba")]
COMBO_IDS = ["full", "full+swa", "full+mamba", "full+swa+mamba"]


def make_config(components=("full",), page_size: int = 1, device_tokens: int = 64,
                host_tokens: int = 128, write_policy: str = "write_through", **kw) -> CacheConfig:
    base = dict(page_size=page_size, device_tokens=device_tokens, host_tokens=host_tokens,
                write_policy=write_policy, components=tuple(components), layers=2, heads=1,
                head_dim=4, dtype=torch.float32, device="cpu")
    if "swa" in components:
        base.update(sliding_window=kw.pop("sliding_window", 6),
                    swa_device_tokens=kw.pop("swa_device_tokens", device_tokens),
                    swa_host_tokens=kw.pop("swa_host_tokens", host_tokens), swa_layers=1)
    if "mamba" in components:
        base.update(mamba_slots=kw.pop("mamba_slots", 16),
                    mamba_host_slots=kw.pop("mamba_host_slots", 32), mamba_state_shape=(3,),
                    mamba_max_states_per_path=kw.pop("mamba_max_states_per_path", None))
    for k in ("sliding_window", "swa_device_tokens", "swa_host_tokens", "mamba_slots",
              "mamba_host_slots", "mamba_max_states_per_path"):
        kw.pop(k, None)  # settings of components this config does not have
    base.update(kw)
    return CacheConfig(**base)


def prefix_hashes(tokens) -> list[int]:
    h, out = 1469598103934665603, []
    for t in tokens:
        h = ((h ^ (t + 1)) * 1099511628211) & 0xFFFFFFFFFFFF
        out.append(h)
    return out


def kv_for(tokens, start: int, end: int, shape_tail, salt: int = 0) -> torch.Tensor:
    """KV rows for positions [start, end): each a function of tokens[:i+1]."""
    hs = prefix_hashes(tokens[:end])[start:end]
    base = torch.tensor([((h ^ salt) % 100003) / 100003.0 for h in hs], dtype=torch.float32)
    layers, heads, dim = shape_tail
    grid = torch.arange(layers * 2 * heads * dim, dtype=torch.float32).view(layers, 2, 1, heads, dim)
    return base.view(1, 1, -1, 1, 1) + grid


def state_for(tokens, end: int, shape) -> torch.Tensor:
    h = prefix_hashes(tokens[:end])[-1] if end else 0
    return torch.full((1, *shape), (h % 9973) / 9973.0)


class Driver:
    """Inserts keys like a serving engine (match, reuse the device prefix, allocate the rest,
    write content, insert) and verifies content after matches and load-backs."""

    def __init__(self, cache: HiRadixCache, branching: bool = False) -> None:
        self.c = cache
        self.swa = "swa" in cache.ci
        self.mamba = "mamba" in cache.ci
        self.branching = branching  # fill in the match's branching point (an engine does)

    def _shape(self, ci: int):
        b = self.c.device_pools[ci].buf
        return (b.shape[0], b.shape[3], b.shape[4])

    def insert(self, tokens, extra_key=None, req_id=None, branching: bool | None = None):
        """``branching``: pass the match's ``branch_len`` (and the MAMBA state there) to
        ``insert`` (default: the driver's setting)."""
        c = self.c
        page = c.page_size
        n = len(tokens) - len(tokens) % page
        tokens = list(tokens[:n])
        m = c.match_prefix(tokens, extra_key=extra_key, req_id=req_id)
        p = m.device_prefix_len
        b = m.branch_len if (self.branching if branching is None else branching) else 0
        # pin the reused prefix while allocating, as an engine does
        lock = c.lock(m.last_device_node, owner=req_id)
        taken: list[tuple[str, torch.Tensor]] = []
        try:
            new = c.alloc(n - p, req_id=req_id)
            taken.append(("full", new))
            c.device_pools[0].write(new, kv_for(tokens, p, n, self._shape(0)))
            kw = {}
            if self.swa:
                si = c.ci["swa"]
                sw = c.alloc(n - p, component="swa", req_id=req_id)
                taken.append(("swa", sw))
                c.device_pools[si].write(sw, kv_for(tokens, p, n, self._shape(si), salt=7))
                kw["swa_indices"] = torch.cat([torch.full((p,), -1, dtype=torch.int64), sw])
                kw["swa_evicted_len"] = 0
            if self.mamba and n:
                mi = c.ci["mamba"]
                slot = c.alloc(1, component="mamba", req_id=req_id)
                taken.append(("mamba", slot))
                c.device_pools[mi].write(slot, state_for(tokens, n,
                                                         c.device_pools[mi].buf.shape[1:]))
                kw["mamba_slot"] = slot
                if 0 < b < n:
                    bslot = c.alloc(1, component="mamba", req_id=req_id)
                    taken.append(("mamba", bslot))
                    c.device_pools[mi].write(bslot, state_for(tokens, b,
                                                              c.device_pools[mi].buf.shape[1:]))
                    kw["mamba_branch_slot"] = bslot
        except Exception:
            for comp, idx in taken:
                c.free(idx, component=comp)
            c.unlock(lock)
            raise
        try:
            return c.insert(tokens, torch.cat([m.device_indices, new]), prev_prefix_len=p,
                            branch_len=b, extra_key=extra_key, req_id=req_id, **kw)
        finally:
            c.unlock(lock)

    def verify_device_prefix(self, tokens, node_id: int) -> int:
        """Check FULL (and SWA / MAMBA where present on device) content up to ``node_id``."""
        c = self.c
        node = c.node(node_id)
        path = c.tree.path_to_root(node)[::-1]
        off = 0
        checked = 0
        for x in path:
            k = len(x.key)
            f = x.data[0].values[Tier.DEVICE]
            if f is not None:
                got = c.device_pools[0].read(f).cpu()
                want = kv_for(tokens, off, off + k, self._shape(0))
                assert torch.equal(got, want), f"FULL content mismatch at node {x.id} pos {off}"
                checked += k
            if self.swa:
                si = c.ci["swa"]
                s = x.data[si].values[Tier.DEVICE]
                if s is not None:
                    got = c.device_pools[si].read(s).cpu()
                    want = kv_for(tokens, off, off + k, self._shape(si), salt=7)
                    assert torch.equal(got, want), f"SWA content mismatch at node {x.id} pos {off}"
            if self.mamba:
                mi = c.ci["mamba"]
                s = x.data[mi].values[Tier.DEVICE]
                if s is not None:
                    got = c.device_pools[mi].read(s).cpu()
                    want = state_for(tokens, off + k, c.device_pools[mi].buf.shape[1:])
                    assert torch.equal(got, want), f"MAMBA state mismatch at node {x.id}"
            off += k
        return checked


def parents(cache: HiRadixCache) -> dict[int, int]:
    return {n.node_id: n.parent_id for n in cache.snapshot().nodes if n.parent_id is not None}


def states(cache: HiRadixCache, comp: str = "full") -> dict[int, str]:
    snap = cache.snapshot()
    i = snap.components.index(comp)
    return {n.node_id: n.components[i].state for n in snap.nodes if n.parent_id is not None}


def seed_001_tree() -> tuple[HiRadixCache, Driver]:
    """Seed bug 001's tree: node 2 (tokens 1..4, no MAMBA state: useless once childless) with
    two children, 1 and 3; write-through selective so nothing is backed up by itself."""
    c = HiRadixCache(make_config(("full", "mamba"), device_tokens=32, host_tokens=64,
                                 write_policy="write_through_selective",
                                 write_through_threshold=100))
    d = Driver(c)
    d.insert(list(range(1, 9)))
    d.insert([1, 2, 3, 4, 90, 91, 92, 93])
    assert parents(c) == {1: 2, 2: 0, 3: 2} and states(c, "mamba")[2] == "tombstone"
    return c, d


def random_session(c: HiRadixCache, rng: random.Random, ops: int, key_max: int,
                   drain=None) -> None:
    """Scheduler-shaped ops at random: inserts, matches with load-backs, locks and unlocks,
    evictions, host round trips, refused calls (raised before the op runs) and failing ones
    (recorded with their error); ``drain()`` every 17th op when given. Ends polled and
    checked."""
    d, receipts = Driver(c), []
    for i in range(ops):
        if drain is not None and i % 17 == 16:
            drain()
        key = [rng.randint(0, key_max) for _ in range(rng.randint(1, 2 * key_max + 4))]
        roll = rng.random()
        try:
            if roll < 0.35:
                d.insert(key, req_id=f"r{i}")
            elif roll < 0.55:
                m = c.match_prefix(key, req_id="m")
                if m.needs_load_back and rng.random() < 0.5:
                    c.load_back(m)
                    c.poll(wait=True)
            elif roll < 0.65 and len(c.tree.nodes) > 1:
                receipts.append(c.lock(rng.choice(sorted(c.tree.nodes)[1:]), owner="o"))
            elif roll < 0.75 and receipts:
                c.unlock(receipts.pop(rng.randrange(len(receipts))))
            elif roll < 0.85:
                c.evict(rng.randint(1, 2 * key_max + 2))
            elif roll < 0.93 and len(c.tree.nodes) > 1:
                c.backup(rng.choice(sorted(c.tree.nodes)[1:]))
                c.poll()
            elif roll < 0.97:
                with pytest.raises((ValueError, TypeError)):  # refused before the op runs
                    c.evict(-rng.randint(1, 3))
            else:
                with pytest.raises(CacheOutOfMemory):  # an op that fails: recorded with it
                    c.alloc(10_000)
        except CacheOutOfMemory:
            pass
    c.poll(wait=True)
    c.check()
