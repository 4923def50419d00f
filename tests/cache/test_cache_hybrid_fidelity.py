"""Issue 14, hybrid fidelity with SGLang's unified cache, one story per behaviour with exact
numbers: fresh SWA leaves capped at one paged window (locks pin one window); SWA pressure frees
SWA in its own LRU order and keeps FULL (leaves included; insert heals); write_back saves
auxiliary data (SWA window, MAMBA state) to host before evicting it from device."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache.tiers import Tier
from tests.kits.cachekit import Driver, make_config, parents, states

K = list(range(1, 21))  # 20 tokens
L = [100 + t for t in range(20)]  # another conversation


def swa_cache(page_size: int = 1, **kw) -> tuple[HiRadixCache, Driver]:
    base = dict(device_tokens=64, host_tokens=0, sliding_window=6, swa_device_tokens=64,
                page_size=page_size)
    base.update(kw)
    c = HiRadixCache(make_config(("full", "swa"), **base))
    return c, Driver(c)


def lengths(c: HiRadixCache) -> dict[int, int]:
    return {n.node_id: n.key_len for n in c.snapshot().nodes if n.parent_id is not None}


def pins(receipt) -> dict[str, tuple[int, ...]]:
    return dict(receipt.pins)


@pytest.mark.parametrize(("page_size", "full_only", "window"), [(1, 14, 6), (4, 12, 8)])
def test_fresh_leaf_is_capped_at_one_paged_window(page_size, full_only, window):
    c, d = swa_cache(page_size)
    d.insert(K)
    # node 1: the part before the window, FULL only (an SWA tombstone); node 2: the window
    assert parents(c) == {1: 0, 2: 1}
    assert lengths(c) == {1: full_only, 2: window}
    assert states(c, "full") == {1: "device", 2: "device"}
    assert states(c, "swa") == {1: "tombstone", 2: "device"}
    assert c.available("swa") == 64 - window  # the caller's other SWA slots were freed
    r = c.lock(2, owner="seq")
    assert pins(r) == {"full": (2, 1), "swa": (2,)}  # the lock pins exactly one window
    assert c.protected[c.ci["swa"]][0] == window
    m = c.match_prefix(K)
    assert (m.device_prefix_len, m.last_device_node) == (20, 2)
    c.unlock(r)
    c.check()


def test_lock_pins_one_window_across_nodes_and_release_swa_unchanged():
    c, d = swa_cache()
    d.insert(K[:16])                 # node 1 [0, 10) FULL only, node 2 [10, 16) window
    d.insert(K)                      # node 3 [16, 20): a short fresh leaf keeps all its SWA
    assert parents(c) == {1: 0, 2: 1, 3: 2}
    assert lengths(c) == {1: 10, 2: 6, 3: 4}
    assert states(c, "swa") == {1: "tombstone", 2: "device", 3: "device"}
    r = c.lock(3, owner="seq")
    assert pins(r) == {"full": (3, 2, 1), "swa": (3, 2)}  # 4 + 6 tokens cover the window of 6
    r2 = c.release_swa(r)
    assert pins(r2) == pins(r) and r2.swa_released
    assert c.protected[c.ci["swa"]][0] == 0 and c.protected[0][0] == 20
    c.unlock(r2)
    c.check()


def test_swa_pressure_tombstones_a_leaf_and_keeps_its_full_data_insert_heals():
    c, d = swa_cache()
    d.insert(K)                                   # node 1 [0, 14), node 2 [14, 20)
    res = c.evict(4, component="swa")
    assert res.tombstoned == (("swa", 2),) and res.deleted == () and res.evicted_nodes == ()
    assert dict(res.freed) == {"full": 0, "swa": 6}
    assert states(c, "full") == {1: "device", 2: "device"}  # FULL stays, leaf included
    assert states(c, "swa") == {1: "tombstone", 2: "tombstone"}
    assert c.evictable[0][0] == 20 and c.available("full") == 44
    m = c.match_prefix(K)
    assert (m.matched_len, m.device_prefix_len, m.best_match_node) == (20, 0, 0)
    d.insert(K)                                   # the same prefix again: heals node 2's window
    assert parents(c) == {1: 0, 2: 1}
    assert states(c, "swa") == {1: "tombstone", 2: "device"}
    assert c.match_prefix(K).device_prefix_len == 20
    d.verify_device_prefix(K, 2)
    c.check()


def test_swa_pressure_frees_in_swa_lru_order():
    c, d = swa_cache()
    d.insert(K)          # nodes 1 (FULL only), 2 (window)
    d.insert(L)          # nodes 3 (FULL only), 4 (window)
    c.match_prefix(K)    # K's window is now the more recent
    res = c.evict(6, component="swa")
    assert res.tombstoned == (("swa", 4),)  # L's window, the least recently used
    assert states(c, "swa") == {1: "tombstone", 2: "device", 3: "tombstone", 4: "tombstone"}
    res = c.evict(6, component="swa")
    assert res.tombstoned == (("swa", 2),)
    assert states(c, "full") == {1: "device", 2: "device", 3: "device", 4: "device"}
    # FULL pressure then deletes the FULL-only leaves (and their FULL-only parents)
    res = c.evict(20)
    assert res.deleted == (4, 3)
    assert parents(c) == {1: 0, 2: 1}
    c.check()


def test_swa_host_pressure_frees_swa_host_copies_only():
    c, d = swa_cache(host_tokens=64, swa_host_tokens=64)
    d.insert(K)
    c.poll(wait=True)                      # write-through: both nodes backed up
    c.evict(20)                            # node 2 demoted; node 1 then demoted too
    assert states(c, "full") == {1: "host", 2: "host"}
    assert states(c, "swa") == {1: "tombstone", 2: "host"}
    res = c.evict_host(6, component="swa")
    assert res.tombstoned == (("swa", 2),) and res.deleted == ()
    assert states(c, "full") == {1: "host", 2: "host"}
    assert states(c, "swa") == {1: "tombstone", 2: "tombstone"}
    c.check()


def test_write_back_saves_the_swa_window_to_host_before_tombstoning():
    c, d = swa_cache(host_tokens=64, swa_host_tokens=64, write_policy="write_back")
    d.insert(K)
    d.insert(K[:16] + [99, 98, 97, 96])  # node 2 splits: node 3 = [14, 16), node 4 the new leaf
    assert parents(c) == {1: 0, 2: 3, 3: 1, 4: 3}
    lk = c.lock(4, owner="seq")          # pins node 4's window: nodes 4, 3 (4 + 2 tokens)
    assert pins(lk)["swa"] == (4, 3)
    res = c.evict(4, component="swa")    # the unpinned SWA holder: node 2, a leaf
    assert res.tombstoned == (("swa", 2),)
    assert states(c, "swa")[2] == "host" and states(c, "full")[2] == "device"
    assert c.available("swa", "host") == 64 - 4
    c.unlock(lk)
    m = c.match_prefix(K)
    # node 2 stays a match boundary: best_match_node stays on it, the SWA host hit is its window
    assert (m.device_prefix_len, m.best_match_node, m.swa_host_hit_length) == (0, 2, 4)
    a = c.admission(m, 0)  # the budget counts the SWA pages the load-back will allocate
    assert (a.component("swa").load_back, a.component("full").load_back, a.fits) == (4, 0, True)
    lb = c.load_back(m)
    assert lb.anchor == 2 and lb.loaded == (("full", 0), ("swa", 4))
    c.poll()
    assert states(c, "swa")[2] == "device+host"
    assert c.match_prefix(K).device_prefix_len == 20
    d.verify_device_prefix(K, 2)
    c.check()


def test_write_back_saves_the_mamba_state_to_host_before_tombstoning():
    c = HiRadixCache(make_config(("full", "mamba"), device_tokens=64, host_tokens=64,
                                 write_policy="write_back"))
    d = Driver(c)
    d.insert(K)
    d.insert(K[:10] + L[:10])  # node 1 splits: node 2 = [0, 10) internal, no state; leaf 3
    assert parents(c) == {1: 2, 2: 0, 3: 2}
    res = c.evict(1, component="mamba")       # node 1's state, the least recently used
    assert res.tombstoned == (("mamba", 1),)
    assert states(c, "mamba") == {1: "host", 2: "tombstone", 3: "device"}
    assert states(c, "full")[1] == "device"
    m = c.match_prefix(K)
    assert (m.device_prefix_len, m.best_match_node, m.mamba_host_hit_length) == (0, 1, 1)
    assert c.admission(m, 0).component("mamba").load_back == 1
    lb = c.load_back(m)
    assert lb.anchor == 1 and lb.loaded == (("full", 0), ("mamba", 1))
    c.poll()
    assert c.match_prefix(K).device_prefix_len == 20
    d.verify_device_prefix(K, 1)
    c.check()


def test_check_reports_an_swa_value_longer_than_one_window():
    c, d = swa_cache()
    d.insert(K)
    node = c.node(1)  # 14 tokens, FULL only: give it SWA over all of them behind check's back
    si = c.ci["swa"]
    node.data[si].values[Tier.DEVICE] = torch.arange(40, 54)
    names = {name for name, _, _ in c.violations()}
    assert "swa.window_cap" in names


def test_ui_draws_an_swa_tombstone_with_full_kept_and_explains_it():
    from radixscope.cache.components import rules
    from radixscope.ui.shaping import states as st_
    from radixscope.ui.shaping.inspect import state_notes
    from radixscope.ui.shaping.tree import state_summary, tree_model

    c, d = swa_cache()
    d.insert(K)
    c.evict(4, component="swa")  # node 2's window tombstoned, FULL kept; node 1 never had SWA
    model = tree_model(c.snapshot())
    assert model.frame.loc[1, "state_swa"] == st_.FULL_KEPT
    assert model.frame.loc[2, "state_swa"] == st_.FULL_KEPT
    assert model.frame.loc[2, "state_full"] == st_.DEVICE
    summary = state_summary(model, "swa")
    assert summary[["state", "nodes", "tokens"]].values.tolist() == [[st_.FULL_KEPT, 2, 20]]
    assert state_notes(model, 2) == [f"swa: {st_.FULL_KEPT} - {rules('swa').tombstone_meaning}"]


def test_doctor_counts_swa_tombstones_with_full_kept():
    from radixscope.telemetry.analysis.doctor import INFO, findings

    c, d = swa_cache()
    d.insert(K)
    c.evict(4, component="swa")
    got = [(f.severity, f.subject, f.message) for f in findings(c.snapshot())]
    assert got == [(INFO, "swa/device", "2 nodes (20 tokens) hold no swa data while their FULL "
                    "KV stays on device (swa tombstones: its own pressure, or outside the "
                    "window); they still serve the FULL prefix and an insert heals them")]
