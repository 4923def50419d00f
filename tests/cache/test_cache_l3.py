"""The cache's L3 tier: writes land as STORAGE values, prefetch brings them back bit for bit,
the hand-back never duplicates what the tree holds, abort releases everything, records replay.
Real file backend in tmp_path; content is a function of the token prefix (cachekit)."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.events import FlightRecorder
from radixscope.cache.snapshot import replay
from radixscope.cache.storage import FileBackend, PrefetchConfig
from radixscope.cache.storage.setup import StorageSetup
from radixscope.cache.storage.stored import StoredPages
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config
from tests.kits.l3kit import (
    evict_everything,
    load_and_verify,
    round_trip,
    storage_cache,
    stored_nodes,
    wait_prefetch,
    write_store,
)
from tests.kits.prefetchkit import Gate


def _toks(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_round_trip_bit_for_bit(tmp_path, components, page_size):
    c = storage_cache(tmp_path, components, page_size)
    toks = _toks(24)
    Driver(c).insert(toks)
    c.poll(wait=True)
    c.check()
    # every node of the chain is stored; the window / state only where host holds them
    assert stored_nodes(c) == sorted(n for n in c.tree.nodes if n)
    for comp in c.comps[1:]:
        assert stored_nodes(c, comp.index), comp.name
    assert c.storage_stats().writes.failed == 0
    evict_everything(c)
    assert list(c.tree.nodes) == [0]
    m = c.match_prefix(toks)
    assert m.best_prefix_len == 0
    hit = round_trip(c, toks)
    assert hit == 24
    m = c.match_prefix(toks)
    assert m.device_prefix_len == 24
    for comp in c.comps[1:]:  # the window / state came back too, and verify_device_prefix read them
        end = c.tree.nodes[m.last_device_node]
        assert end.data[comp.index].values[Tier.DEVICE] is not None, comp.name
    assert stored_nodes(c) == sorted(n for n in c.tree.nodes if n)  # they came from L3
    c.close()


def test_second_cache_on_the_same_store_hits_what_the_first_wrote(tmp_path):
    a = storage_cache(tmp_path, ("full", "swa", "mamba"), 4)
    toks = _toks(32)
    Driver(a).insert(toks)
    a.poll(wait=True)
    a.close()
    b = storage_cache(tmp_path, ("full", "swa", "mamba"), 4)
    Driver(b).insert(toks[:8])  # a shorter host prefix: the chain continues from its last hash
    b.poll(wait=True)
    m = b.match_prefix(toks, req_id="r", prefetch=True)
    assert (m.prefetch_status, m.prefetch_tokens, m.device_prefix_len) == ("started", 24, 8)
    wait_prefetch(b, "r")
    st = b.prefetch_state("r")
    assert (st.status, st.hit_tokens, st.reason) == ("done", 24, "complete")
    m = b.match_prefix(toks, req_id="r", prefetch=True)
    assert (m.host_hit_length, m.storage_hit_length) == (24, 24)
    load_and_verify(b, m, toks)
    b.close()


def test_store_keeps_host_pins_until_acked(tmp_path):
    inner = FileBackend(tmp_path / "l3")
    gate = _SetGate(inner)
    c = storage_cache(tmp_path, ("full", "swa"), 1, backend=gate)
    Driver(c).insert(_toks(12))
    c.poll()  # acks the backup: the store starts and blocks in batch_set
    assert gate.entered.wait(10)
    owners = [e.owner for e in c.locks.values()]
    assert any(o.startswith("store:") for o in owners)
    (tid,) = c.store_transfers
    snap = c.snapshot()
    assert [(t.transfer_id, t.kind, t.tier) for t in snap.transfers] == [(tid, "store", "storage")]
    c.evict(100)
    assert c.evict_host(100).deleted == ()  # the stored nodes are pinned on host
    c.check()
    assert stored_nodes(c) == []
    gate.release()
    assert c.poll(wait=True) == [tid]
    c.check()
    assert not any(str(e.owner).startswith("store:") for e in c.locks.values())
    assert stored_nodes(c) == [1, 2]
    assert c.evict_host(100).deleted  # no longer pinned
    c.check()
    c.close()


class _SetGate(Gate):
    """Holds the first batch_set until released."""

    def __init__(self, inner):
        super().__init__(inner, lambda n, keys: False)

    def _put(self, keys, blobs):
        self.entered.set()
        assert self.opened.wait(20)
        return self.inner._put(keys, blobs)


def test_write_policies(tmp_path):
    toks = _toks(16)
    for policy, threshold, want in (("write_through_selective", 50, 0),
                                    ("write_through_selective", 1, 1), ("write_back", 2, 0)):
        root = tmp_path / f"{policy}{threshold}"
        be = FileBackend(root)
        c = HiRadixCache(make_config(("full",), host_tokens=64),
                         storage=StorageSetup(be, write_policy=policy, write_threshold=threshold))
        Driver(c).insert(toks)
        c.poll(wait=True)
        assert len(stored_nodes(c)) == want, policy
        assert be.stats().calls.get("set", 0) == want
        c.evict(100)
        c.evict_host(100)  # write_back writes the leaf right before it goes
        c.check()
        if policy == "write_back":
            assert c.storage_stats().writes.write_back_pages == 16
            assert be.stats().pages.get("set.ok") == 16
        c.close()


def test_pages_put_in_the_tree_meanwhile_are_freed_not_duplicated(tmp_path):
    toks = _toks(16)
    write_store(tmp_path, toks, ("full", "swa", "mamba"), 1)
    gate = Gate(FileBackend(tmp_path / "l3"), lambda n, keys: True)
    c = storage_cache(tmp_path, ("full", "swa", "mamba"), 1, backend=gate)
    m = c.match_prefix(toks, req_id="r", prefetch=True)
    assert m.prefetch_status == "started"
    assert gate.entered.wait(10)
    held = c.prefetch_host_slots()
    assert held["full"] == 16 and held["mamba"] == 1
    adm = c.admission(m, 16)
    assert adm.components[0].prefetch_host == 16
    Driver(c).insert(toks[:10])  # another request caches the first 10 tokens meanwhile
    c.check()
    gate.release()
    wait_prefetch(c, "r")
    c.poll(wait=True)
    c.check()
    m = c.match_prefix(toks, req_id="r", prefetch=True)
    assert (m.device_prefix_len, m.host_hit_length, m.storage_hit_length) == (10, 6, 6)
    assert sum(len(n.key) for n in c.tree.nodes.values()) == 16  # no duplicate path
    assert c.prefetch_host_slots() == {"full": 0, "swa": 0, "mamba": 0}
    load_and_verify(c, m, toks)
    c.close()


def test_abort_releases_everything(tmp_path):
    toks = _toks(16)
    write_store(tmp_path, toks, ("full", "swa"), 1)
    gate = Gate(FileBackend(tmp_path / "l3"), lambda n, keys: True)
    c = storage_cache(tmp_path, ("full", "swa"), 1, backend=gate)
    Driver(c).insert(toks[:4])
    c.poll(wait=True)
    m = c.match_prefix(toks, req_id="r", prefetch=True)
    assert m.prefetch_status == "started" and gate.entered.wait(10)
    assert any(str(e.owner) == "prefetch:r" for e in c.locks.values())
    assert [s.req_id for s in c.pending_prefetches()] == ["r"]
    assert c.match_prefix(toks, req_id="r", prefetch=True).prefetch_status == "ongoing"
    assert c.abort_prefetch("r") is True
    assert c.prefetch_state("r") is None and c.pending_prefetches() == []
    assert not any(str(e.owner).startswith("prefetch:") for e in c.locks.values())
    c.check()
    gate.release()
    for _ in range(2000):  # the worker drains; the next polls free its slots
        c.poll()
        c.check()
        if c.prefetch_host_slots() == {"full": 0, "swa": 0}:
            break
    assert c.prefetch_host_slots() == {"full": 0, "swa": 0}
    assert c.abort_prefetch("r") is False
    c.close()


def test_records_replay_to_the_live_snapshot(tmp_path):
    rec = FlightRecorder()
    toks = _toks(12)
    c = storage_cache(tmp_path, ("full", "mamba"), 4, recorder=rec)
    Driver(c).insert(toks)
    c.poll(wait=True)
    evict_everything(c)
    round_trip(c, toks)
    ops, muts = rec.tail()
    starts = [m for m in muts if m.kind == ev.TRANSFER_START and m.tier == "storage"]
    assert starts and all(m.value[1] == "store" for m in starts)
    stores = [o for o in ops if o.op == ev.OP_TRANSFER and o.attrs[ev.A_TRANSFER_KIND] == "store"]
    assert stores and stores[0].attrs[ev.A_STORAGE_FAILED] == 0
    (pf,) = [o for o in ops if o.op == ev.OP_PREFETCH and o.req_id == "rt"]
    assert pf.attrs[ev.A_PREFETCH_REASON] == "complete"
    assert (pf.attrs[ev.A_PREFETCH_ASKED], pf.attrs[ev.A_PREFETCH_HIT]) == (12, 12)
    assert replay(rec.initial_snapshot, [tuple(m) for m in muts]) == c.snapshot()
    snap = c.snapshot()
    lens = {n.node_id: n.components[0].length("storage") for n in snap.nodes if n.parent_id is not None}
    assert set(lens.values()) == {12}
    c.close()


def test_stored_pages_value():
    h = tuple(bytes([i]) * 32 for i in range(3))
    sp = StoredPages(h, 4)
    assert sp.numel() == 12 and sp[:4].hashes == h[:1] and sp[4:].hashes == h[1:]
    assert StoredPages(h[:1], 4, True).numel() == 1
    with pytest.raises(ValueError, match="whole pages"):
        sp[:3]
    with pytest.raises(ValueError, match="state"):
        StoredPages(h, 4, True)
    with pytest.raises(AttributeError):
        sp.page_size = 2


def test_bad_input_raises_before_anything_changes(tmp_path):
    be = FileBackend(tmp_path / "l3")
    with pytest.raises(TypeError, match="StorageSetup"):
        HiRadixCache(make_config(), storage=be)
    with pytest.raises(ValueError, match="host tier"):
        HiRadixCache(make_config(host_tokens=0), storage=StorageSetup(be))
    for bad in ({"write_policy": "sometimes"}, {"write_threshold": 0}, {"model": ""}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StorageSetup(be, **bad)
    with pytest.raises(TypeError, match="prefetch"):
        StorageSetup(be, prefetch={"policy": "timeout"})
    c = storage_cache(tmp_path, ("full",), 1)
    Driver(c).insert(_toks(8))
    before = c.snapshot()
    with pytest.raises(ValueError, match="req_id"):
        c.match_prefix(_toks(8), prefetch=True)
    with pytest.raises(TypeError, match="prefetch"):
        c.match_prefix(_toks(8), req_id="r", prefetch="yes")
    with pytest.raises(TypeError, match="req_id"):
        c.abort_prefetch(3)
    assert c.snapshot() == before
    c.close()


def test_without_storage_nothing_changes(tmp_path):
    c = HiRadixCache(make_config(("full", "swa")))
    Driver(c).insert(_toks(8))
    m = c.match_prefix(_toks(8), req_id="r", prefetch=True)
    assert (m.prefetch_status, m.storage_hit_length) == ("off", 0)
    assert "storage" not in c.info() and c.storage is None and c.prefetcher is None
    assert c.pending_prefetches() == [] and c.prefetch_state("r") is None
    assert c.abort_prefetch("r") is False
    c.close()
    with pytest.raises(ValueError, match="no storage"):
        c.storage_stats()


def test_info_names_the_storage_tier(tmp_path):
    c = storage_cache(tmp_path, ("full",), 1, policy="timeout", threshold=64)
    assert c.info()["storage"] == {"backend": "file", "write_policy": "write_through",
                                   "prefetch_policy": "timeout", "threshold_tokens": 64}
    m = c.match_prefix(_toks(8), req_id="r", prefetch=True)
    assert (m.prefetch_status, m.prefetch_tokens) == ("below_threshold", 8)
    assert not c.locks
    c.close()


def test_prefetch_config_reaches_the_controller(tmp_path):
    be = FileBackend(tmp_path / "l3")
    pf = PrefetchConfig(policy="best_effort", threshold_tokens=16)
    c = HiRadixCache(make_config(), storage=StorageSetup(be, prefetch=pf))
    assert c.prefetcher.config is pf and c.storage.prefetch is pf
    assert isinstance(c.host_pools[0].buf, torch.Tensor)
    c.close()


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_a_store_never_reads_host_slots_a_backup_has_not_written(tmp_path, components):
    """Regression (found by the three-tier fuzzer): a poll of a subset acked a child's backup
    before its parent's; the store of the chain then read the parent's host slots before its
    copy ran and L3 got garbage under the parent's page hashes. Stores now wait until every
    node of the chain is on host."""
    c = storage_cache(tmp_path, components, 1)
    d = Driver(c)
    toks = _toks(16)
    (t1,) = d.insert(toks[:8]).backups
    (t2,) = d.insert(toks).backups
    assert c.poll([t2]) == [t2]   # the child's copy lands first; the parent's is still queued
    assert not c.store_transfers  # so no store reads the parent's unwritten host slots
    assert c.poll([t1]) == [t1]
    c.poll(wait=True)
    c.check()
    assert stored_nodes(c) == sorted(n for n in c.tree.nodes if n)
    evict_everything(c)
    assert round_trip(c, toks) == 16  # bit for bit: what L3 holds is what was written
    c.close()


def test_hand_back_under_a_device_only_anchor_keeps_host_copies_prefix_closed(tmp_path):
    """Regression (found by the three-tier fuzzer): a prefetch anchored on a node that was
    never backed up (write_through_selective below its threshold) hung host-only nodes under a
    parent with no host copy (full.host_prefix_closed). The hand-back now backs the anchor's
    chain up first (or, with no host room, frees what cannot hang there)."""
    toks = _toks(16)
    a = storage_cache(tmp_path, ("full",), 4)
    Driver(a).insert(toks)
    a.poll(wait=True)
    a.close()
    cfg = make_config(("full",), page_size=4, write_policy="write_through_selective",
                      write_through_threshold=100)
    pf = PrefetchConfig(policy="wait_complete", threshold_tokens=4)
    c = HiRadixCache(cfg, storage=StorageSetup(FileBackend(tmp_path / "l3"), prefetch=pf))
    Driver(c).insert(toks[:4])
    c.poll(wait=True)
    (n,) = [x for x in c.tree.nodes.values() if x.parent is not None]
    assert n.data[0].values[Tier.HOST] is None  # device only
    assert c.match_prefix(toks, req_id="r", prefetch=True).prefetch_status == "started"
    wait_prefetch(c, "r")  # check() after every poll: host copies stay prefix-closed
    assert n.data[0].values[Tier.HOST] is not None  # backed up by the hand-back
    assert c.prefetch_state("r").hit_tokens == 12
    m = c.match_prefix(toks, req_id="r", prefetch=True)
    assert (m.device_prefix_len, m.host_hit_length, m.storage_hit_length) == (4, 12, 12)
    load_and_verify(c, m, toks)
    c.close()


def test_selective_writes_a_node_once_it_gets_hot(tmp_path):
    be = FileBackend(tmp_path / "l3")
    c = HiRadixCache(make_config(("full",), host_tokens=64),
                     storage=StorageSetup(be, write_policy="write_through_selective",
                                          write_threshold=3))
    toks = _toks(16)
    Driver(c).insert(toks)
    c.poll(wait=True)
    assert stored_nodes(c) == []  # not hot yet
    hits = []
    for i in range(3):
        c.match_prefix(toks, req_id=f"r{i}", prefetch=True)
        c.poll(wait=True)
        hits.append((c.tree.nodes[1].hit_count, stored_nodes(c)))
    assert hits == [(2, []), (3, [1]), (4, [1])]  # written the poll after its 3rd hit
    c.check()
    c.close()
