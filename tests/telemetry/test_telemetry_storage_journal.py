"""The store keeps each node's L3 (STORAGE) length per component: a real cache's records with
the write path's ``store`` transfers in them (``tests/kits/storage_records.py``) go through
telemetry into a store; ``state_at`` at every seq (keyframes and replay mixed) equals the
reference replay of what was sent, STORAGE lengths included."""

from __future__ import annotations

import pytest

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache.snapshot import replay
from radixscope.cache.tiers import STORAGE
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config
from tests.kits.storage_records import StorageTap


def run_with_storage(path, components, keyframe_every=7, steps=12):
    """Drive a real cache whose records carry L3 writes into a store at ``path``."""
    tel = telemetry.setup(store=path, mode="inline", metrics=False, capture_host_spans=False,
                          keyframe_every=keyframe_every)
    tap = StorageTap(tel.recorder)
    c = HiRadixCache(make_config(components, device_tokens=24, host_tokens=48,
                                 write_policy="write_through"), recorder=tap)
    d = Driver(c)
    for i in range(steps):
        d.insert([1, 2, 3, 4, 5, 6][: 2 + i % 5] + [100 + i, 7, 8])
        tel.flush()
        if i % 3 == 2:
            c.poll(wait=True)
        if i % 4 == 3:
            c.evict(6)
    c.poll(wait=True)
    tel.close()
    return tap


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_state_at_every_seq_keeps_the_storage_lengths(tmp_path, components):
    tap = run_with_storage(tmp_path / "s.db", components)
    assert tap.stores >= 3
    seqs = [m[0] for m in tap.mutations]
    assert seqs == list(range(tap.start.seq + 1, tap.start.seq + 1 + len(seqs)))
    with telemetry.open_store(tmp_path / "s.db") as r:
        assert len(r.keyframes()) >= 3
        assert r.last_seq() == seqs[-1]
        with_storage = 0
        for seq in [tap.start.seq, *seqs]:
            want = replay(tap.start, tap.mutations, upto_seq=seq)
            got = r.state_at(seq)
            assert got == want, f"state_at({seq}) differs"
            with_storage += any(s.lens[STORAGE] is not None
                                for nd in got.nodes for s in nd.components)
        assert with_storage > len(seqs) // 2
        final = r.state_at(seqs[-1])
        # every component that has a host copy on a node is also in L3 there (write-through)
        stored = [(nd.node_id, c) for nd in final.nodes
                  for c, s in zip(final.components, nd.components, strict=True)
                  if s.lens[STORAGE] is not None]
        assert stored and {c for _, c in stored} == set(components)
        for nd in final.nodes:
            for s in nd.components:
                assert s.state != "tombstone" or s.lens[STORAGE] is None
                if s.lens[STORAGE] is not None:
                    assert "storage" in s.state
        # the store transfers to tier "storage" are in the ops and the journal
        ops = r.ops("transfer")
        assert (ops["attrs"].map(lambda a: a.get("transfer_kind")) == "store").sum() == tap.stores
