"""A random-operation fuzzer for the cache: delayed, reordered and duplicated polls; content
verified for every slot ``match_prefix`` returns at the moment it returns and for every
copy-on-write; handles from a second cache; frees of tree slots; ``check()`` after every op.

``fuzz(components, page_size, policy, seed, ops)`` returns a ``FuzzStats``; any invariant
violation or content mismatch is counted (and the first one kept as text).

With ``storage=DIR`` the cache has a third tier (a file backend in DIR, optionally wrapped in a
``FaultyBackend`` with ``faults``) and the ops include L3 prefetch / abort / full polls and a
storage -> host -> device round trip whose device content is verified bit for bit."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from radixscope.cache import CacheOutOfMemory, HiRadixCache, InvariantViolation
from radixscope.cache.storage import FaultyBackend, FileBackend, PrefetchConfig, StorageSetup
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import Driver, kv_for, make_config, state_for


@dataclass
class FuzzStats:
    ops: int = 0
    positions: int = 0           # token positions whose content was verified
    violations: int = 0
    mismatches: int = 0
    rejected: int = 0            # bad calls the cache refused as it should
    first_failure: str = ""
    per_op: dict = field(default_factory=dict)

    def add(self, other: FuzzStats) -> None:
        for k in ("ops", "positions", "violations", "mismatches", "rejected"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.first_failure = self.first_failure or other.first_failure


class Mismatch(AssertionError):
    pass


def _cfg(components, page: int, policy: str, device: str = "cpu"):
    return make_config(components, page_size=page, device_tokens=24 * page, device=device,
                       host_tokens=32 * page, write_policy=policy,
                       sliding_window=3 * page - 1, swa_device_tokens=20 * page,
                       swa_host_tokens=28 * page, mamba_slots=8, mamba_host_slots=10,
                       mamba_max_states_per_path=3)


def _storage(root: Path, page: int, seed: int, faults: dict | None) -> StorageSetup:
    rng = random.Random(seed)
    backend = FileBackend(Path(root) / "l3", max_bytes=rng.choice([None, 64 << 10]))
    if faults:
        backend = FaultyBackend(backend, seed=seed, **faults)
    pf = PrefetchConfig(policy=rng.choice(["best_effort", "wait_complete", "timeout"]),
                        threshold_tokens=page, batch_pages=2, timeout_base_s=0.01,
                        timeout_per_ki_token_s=0.0, max_host_share=0.5)
    return StorageSetup(backend, write_policy=rng.choice(
        ["write_through", "write_through_selective", "write_back"]), write_threshold=2,
        prefetch=pf)


class Fuzzer:
    def __init__(self, components, page: int, policy: str, seed: int,
                 storage: Path | None = None, faults: dict | None = None,
                 device: str = "cpu") -> None:
        self.rng = random.Random(seed)
        self.c = HiRadixCache(_cfg(components, page, policy, device),
                              storage=None if storage is None
                              else _storage(storage, page, seed, faults))
        self.other = HiRadixCache(_cfg(components, page, policy))
        Driver(self.other).insert([0] * page)
        self.foreign_match = self.other.match_prefix([0] * page)
        self.d = Driver(self.c)
        self.comps = list(components)
        self.page = page
        self.receipts: list = []
        self.held: list[tuple[str, torch.Tensor]] = []
        self.cow_checks: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.stats = FuzzStats()
        self.inserted: list[list[int]] = []  # keys inserted whole (their ends hold states)
        self.ops = [self.insert, self.insert, self.match, self.match_cow, self.lock, self.unlock,
                    self.alloc, self.free, self.evict, self.evict_host, self.backup,
                    self.load_back, self.load_back, self.poll_some, self.poll_some,
                    self.poll_dup, self.foreign, self.free_tree_slots]
        if "swa" in components:
            self.ops.append(self.release_swa)
        if storage is not None:
            self.ops += [self.prefetch, self.prefetch, self.abort_prefetch, self.poll_all,
                         self.poll_all, self.l3_round_trip]

    # ---- helpers -------------------------------------------------------------------------
    def key(self) -> list[int]:
        r = self.rng
        return [t for t in (r.randint(0, 3) for _ in range(r.randint(0, 12)))
                for _ in range(self.page)]

    def _mamba_shape(self):
        return self.c.device_pools[self.c.ci["mamba"]].buf.shape[1:]

    def verify_match(self, key, m) -> None:
        """Every slot the match returns holds the content of its token prefix, now."""
        c, n = self.c, m.device_prefix_len
        if n:
            got = c.device_pools[0].read(m.device_indices).cpu()
            if not torch.equal(got, kv_for(key, 0, n, self.d._shape(0))):
                raise Mismatch(f"match of {key[:n]} returned unreadable FULL slots")
            self.d.verify_device_prefix(key, m.last_device_node)
            self.stats.positions += n
        if m.mamba_slot is not None:
            pool = c.device_pools[c.ci["mamba"]]
            want = state_for(key, n, self._mamba_shape())
            if not torch.equal(pool.read(m.mamba_slot).cpu(), want):
                raise Mismatch(f"CoW of the state at {n} tokens copied unloaded data")
            self.held.append(("mamba", m.mamba_slot))

    # ---- operations ----------------------------------------------------------------------
    def insert(self) -> None:
        key = self.key()
        try:  # half the inserts fill in their match's branching point
            self.d.insert(key, req_id="r", branching=self.rng.random() < 0.5)
        except CacheOutOfMemory:
            return
        self.inserted.append(key)

    def match(self, cow: bool = False) -> None:
        key = self.key()
        try:
            m = self.c.match_prefix(key, cow_mamba=cow)
        except CacheOutOfMemory:
            return
        self.verify_match(key, m)

    def match_cow(self) -> None:
        self.match(cow="mamba" in self.comps)

    def lock(self) -> None:
        m = self.c.match_prefix(self.key())
        node = m.best_match_node if self.rng.random() < 0.5 else m.last_device_node
        self.receipts.append(self.c.lock(node, owner="req"))

    def unlock(self) -> None:
        if self.receipts:
            self.c.unlock(self.receipts.pop(self.rng.randrange(len(self.receipts))))

    def release_swa(self) -> None:
        if self.receipts:
            i = self.rng.randrange(len(self.receipts))
            if not self.receipts[i].swa_released:
                self.receipts[i] = self.c.release_swa(self.receipts[i])

    def alloc(self) -> None:
        comp = self.rng.choice(self.comps)
        n = self.rng.randint(0, 10) if comp != "mamba" else 1
        try:
            self.held.append((comp, self.c.alloc(n, component=comp)))
        except CacheOutOfMemory:
            pass

    def free(self) -> None:
        if self.held:
            i = self.rng.randrange(len(self.held))
            comp, idx = self.held[i]
            if comp == "mamba" and int(idx[0]) in self.c.cow_pending:
                self._refused(lambda: self.c.free(idx, component=comp), "poll it before freeing")
                return
            self.held.pop(i)
            if comp == "mamba":  # a CoW slot's pending check runs before the slot can be reused
                self._check_cows()
                self.cow_checks = [x for x in self.cow_checks if not torch.equal(x[1], idx)]
            self.c.free(idx, component=comp)

    def evict(self) -> None:
        self.c.evict(self.rng.randint(0, 12) * self.page, component=self.rng.choice(self.comps))

    def evict_host(self) -> None:
        self.c.evict_host(self.rng.randint(0, 12) * self.page,
                          component=self.rng.choice(self.comps))

    def backup(self) -> None:
        m = self.c.match_prefix(self.key())
        if m.last_device_node:
            self.c.backup(m.last_device_node)

    def load_back(self) -> None:
        """Start a load-back and leave it in flight: a later op polls it, in any order."""
        key = self.key()
        m = self.c.match_prefix(key)
        self.verify_match(key, m)
        if not m.needs_load_back:
            return
        cow = "mamba" in self.comps and self.rng.random() < 0.5
        try:
            lb = self.c.load_back(m, cow_mamba=cow)
        except CacheOutOfMemory:
            return
        if lb.mamba_slot is not None:
            want = state_for(key, self.c.node_prefix_len(lb.anchor), self._mamba_shape())
            self.cow_checks.append((lb.transfer_id, lb.mamba_slot, want))
            self.held.append(("mamba", lb.mamba_slot))
        self._check_cows()

    def _check_cows(self) -> None:
        pool = self.c.device_pools[self.c.ci["mamba"]] if "mamba" in self.comps else None
        left = []
        for tid, slot, want in self.cow_checks:
            if tid is not None and tid in self.c.transfers:
                left.append((tid, slot, want))
            elif not torch.equal(pool.read(slot).cpu(), want):
                raise Mismatch(f"load-back CoW slot {slot.tolist()} holds the wrong state")
        self.cow_checks = left

    def poll_some(self) -> None:
        ids = list(self.c.transfers)
        if ids:
            pick = self.rng.sample(ids, self.rng.randint(1, len(ids)))  # a reordered subset
            got = self.c.poll(pick)
            if self.c.engine.cuda:  # a copy still running on the side stream stays pending
                assert got == [t for t in pick if t in got], (pick, got)
                assert all(t in self.c.transfers for t in pick if t not in got)
            else:  # deferred CPU copies run at the poll
                assert got == pick, (pick, got)
        self._check_cows()

    def _refused(self, call, needle: str) -> None:
        before = self.c.snapshot()
        try:
            call()
        except (ValueError, TypeError) as e:
            assert needle in str(e), str(e)
        else:
            raise AssertionError(f"bad call accepted (expected {needle!r})")
        self.c.check()
        assert self.c.snapshot() == before
        self.stats.rejected += 1

    def poll_dup(self) -> None:
        ids = list(self.c.transfers)
        if ids:
            t = self.rng.choice(ids)
            self._refused(lambda: self.c.poll([t, t]), "appears more than once")

    def foreign(self) -> None:
        m = self.foreign_match
        call = self.rng.choice([lambda: self.c.load_back(m), lambda: self.c.admission(m, 1)])
        self._refused(call, "another cache instance")

    def free_tree_slots(self) -> None:
        nodes = [n for n in self.c.tree.nodes.values() if n.parent is not None
                 and n.data[0].values[Tier.DEVICE] is not None]
        if nodes:
            v = self.rng.choice(nodes).data[0].values[Tier.DEVICE].clone()
            self._refused(lambda: self.c.free(v), "owned by the tree")

    # ---- L3 ------------------------------------------------------------------------------
    def _req(self) -> str:
        return f"p{self.rng.randrange(4)}"

    def prefetch(self) -> None:
        key = self.key()
        try:
            m = self.c.match_prefix(key, req_id=self._req(), prefetch=True)
        except CacheOutOfMemory:
            return
        self.verify_match(key, m)

    def abort_prefetch(self) -> None:
        self.c.abort_prefetch(self._req())

    def poll_all(self) -> None:
        self.c.poll(wait=self.rng.random() < 0.3)
        self._check_cows()

    def l3_round_trip(self) -> None:
        """Prefetch a key to the end, load it back, verify the device content of the whole
        loaded prefix (whatever came from L3, host or device)."""
        key, req = self.key(), "rt"
        if self.inserted and self.rng.random() < 0.7:  # a whole inserted key: its end has a state
            key = self.rng.choice(self.inserted[-8:])
        self.c.abort_prefetch(req)
        if self.rng.random() < 0.7:  # drop what device and host hold, so L3 has to serve it
            self.c.poll(wait=True)
            for comp in reversed(self.comps):
                self.c.evict(10**6, component=comp)
            for comp in reversed(self.comps):
                self.c.evict_host(10**6, component=comp)
            self.c.check()
        try:
            self.c.match_prefix(key, req_id=req, prefetch=True)
        except CacheOutOfMemory:
            return
        deadline = time.monotonic() + 10
        while (st := self.c.prefetch_state(req)) is not None and st.status == "ongoing":
            assert time.monotonic() < deadline, "prefetch never handed back"
            self.c.poll()
            self.c.check()
            time.sleep(0.001)
        m = self.c.match_prefix(key, req_id=req, prefetch=True)
        self.verify_match(key, m)
        if not m.needs_load_back:
            return
        try:
            lb = self.c.load_back(m)
        except CacheOutOfMemory:
            return
        self.c.poll(wait=True)
        self._check_cows()
        self.stats.positions += self.d.verify_device_prefix(key, lb.anchor)
        self.stats.per_op["l3_verified_tokens"] = (self.stats.per_op.get(
            "l3_verified_tokens", 0) + m.storage_hit_length)
        self.c.abort_prefetch(req)

    # ---- driver --------------------------------------------------------------------------
    def run(self, ops: int) -> FuzzStats:
        try:
            return self._run(ops)
        except AssertionError as e:  # verify_device_prefix raises a plain AssertionError
            self.stats.mismatches += 1
            self.stats.first_failure = self.stats.first_failure or str(e)
            return self.stats
        finally:
            self.c.close()

    def _run(self, ops: int) -> FuzzStats:
        st = self.stats
        for _ in range(ops):
            op = self.rng.choice(self.ops)
            st.ops += 1
            st.per_op[op.__name__] = st.per_op.get(op.__name__, 0) + 1
            try:
                op()
            except Mismatch as e:
                st.mismatches += 1
                st.first_failure = st.first_failure or f"{op.__name__}: {e}"
                return st
            try:
                self.c.check()
            except InvariantViolation as e:
                st.violations += 1
                st.first_failure = st.first_failure or f"after {op.__name__}: {e}"
                return st
        self.c.poll()
        self._check_cows()
        self.c.check()
        return st


def fuzz(components, page: int, policy: str, seed: int, ops: int, storage: Path | None = None,
         faults: dict | None = None, device: str = "cpu") -> FuzzStats:
    """``device``: the cache's device pools ('cuda' runs the copies on the side stream)."""
    return Fuzzer(components, page, policy, seed, storage, faults, device).run(ops)
