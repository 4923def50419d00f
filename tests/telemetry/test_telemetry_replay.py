"""The replay oracle: random operation sequences on the real cache, recorded into a store; then
the store's journal replayed from empty, and ``state_at`` at random seqs, equal the cache's own
snapshots taken at those seqs, exactly. Keyframes come every few mutations so ``state_at`` mixes
keyframes and replay."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixscope import telemetry
from radixscope.cache import CacheOutOfMemory, HiRadixCache
from radixscope.cache.snapshot import replay
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config

KEYS = st.lists(st.integers(0, 3), min_size=0, max_size=10)


def machine_for(components, page_size: int, policy: str):
    class ReplayMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.dir = Path(tempfile.mkdtemp(prefix="telreplay-"))
            self.tel = telemetry.setup(store=self.dir / "s.db", mode="inline", metrics=False,
                                       capture_host_spans=False, keyframe_every=11)
            cfg = make_config(components, page_size=page_size, device_tokens=20 * page_size,
                              host_tokens=28 * page_size, write_policy=policy,
                              sliding_window=3 * page_size - 1, mamba_slots=8,
                              mamba_host_slots=10, mamba_max_states_per_path=3)
            self.c = HiRadixCache(cfg, recorder=self.tel.recorder)
            self.d = Driver(self.c)
            self.page = page_size
            self.receipts: list = []
            self.held: list[tuple[str, torch.Tensor]] = []
            self.snaps = {self.c.snapshot().seq: self.c.snapshot()}

        def k(self, key):
            return [t for t in key for _ in range(self.page)]

        @rule(key=KEYS)
        def insert(self, key):
            try:
                self.d.insert(self.k(key), req_id="r")
            except CacheOutOfMemory:
                pass

        @rule(key=KEYS, best=st.booleans())
        def lock(self, key, best):
            m = self.c.match_prefix(self.k(key))
            self.receipts.append(self.c.lock(m.best_match_node if best else m.last_device_node,
                                             owner="req"))

        @precondition(lambda self: self.receipts)
        @rule(data=st.data())
        def unlock(self, data):
            self.c.unlock(self.receipts.pop(data.draw(st.integers(0, len(self.receipts) - 1))))

        @rule(n=st.integers(0, 8), comp=st.sampled_from(components))
        def alloc(self, n, comp):
            try:
                self.held.append((comp, self.c.alloc(min(n, 1) if comp == "mamba" else n,
                                                     component=comp)))
            except CacheOutOfMemory:
                pass

        @precondition(lambda self: self.held)
        @rule()
        def free(self):
            comp, idx = self.held.pop()
            self.c.free(idx, component=comp)

        @rule(n=st.integers(0, 12), comp=st.sampled_from(components))
        def evict(self, n, comp):
            self.c.evict(n * self.page, component=comp)

        @rule(n=st.integers(0, 12))
        def evict_host(self, n):
            self.c.evict_host(n * self.page)

        @rule(key=KEYS)
        def backup(self, key):
            m = self.c.match_prefix(self.k(key))
            if m.last_device_node:
                self.c.backup(m.last_device_node)

        @rule(key=KEYS, cow=st.booleans())
        def load_back(self, key, cow):
            m = self.c.match_prefix(self.k(key))
            if not m.needs_load_back:
                return
            try:
                lb = self.c.load_back(m, cow_mamba=cow)
            except CacheOutOfMemory:
                return
            if lb.mamba_slot is not None:
                self.held.append(("mamba", lb.mamba_slot))

        @rule(data=st.data())
        def poll_some(self, data):
            ids = list(self.c.transfers)
            if ids:
                self.c.poll(data.draw(st.lists(st.sampled_from(ids), unique=True)))

        @rule()
        def flush(self):
            self.tel.flush()  # keyframes land between batches

        @invariant()
        def remember(self):
            snap = self.c.snapshot()
            self.snaps[snap.seq] = snap

        def teardown(self):
            try:
                stats = self.tel.close()
                assert sum(stats["dropped"].values()) == 0 and stats["failures"] == {}
                final = self.c.snapshot()
                with telemetry.open_store(self.dir / "s.db") as r:
                    assert r.last_seq() == final.seq
                    first = r.keyframe(int(r.keyframes()["seq"].iloc[0]))
                    assert replay(first, r.journal()) == final
                    seqs = sorted(self.snaps)
                    picks = seqs[:: max(1, len(seqs) // 12)] + [seqs[-1]]
                    for seq in picks:
                        assert r.state_at(seq) == self.snaps[seq], f"state_at({seq})"
                    for seq in r.keyframes()["seq"]:
                        if int(seq) in self.snaps:
                            assert r.keyframe(int(seq)) == self.snaps[int(seq)]
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)

    ReplayMachine.__name__ = f"Replay_{'_'.join(components)}_p{page_size}_{policy}"
    return ReplayMachine


CASES = [(comps, 1, "write_through") for comps in COMBOS] + [
    (("full", "swa", "mamba"), 2, "write_back"), (("full",), 4, "write_through_selective")]


@pytest.mark.parametrize(("components", "page_size", "policy"), CASES,
                         ids=[*COMBO_IDS, "hybrid-p2-write_back", "full-p4-selective"])
def test_store_replays_to_the_cache_snapshots(components, page_size, policy):
    machine = machine_for(components, page_size, policy)
    machine.TestCase.settings = settings(
        max_examples=8, stateful_step_count=30, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck))
    machine.TestCase().runTest()
