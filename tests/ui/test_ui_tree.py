"""ui.shaping.tree / states: the tree model of a snapshot, with exact numbers."""

from __future__ import annotations

import dataclasses

import pytest

from radixscope.cache.snapshot import ComponentState
from radixscope.ui.shaping import states as st_
from radixscope.ui.shaping.tree import node_label, state_summary, tree_model
from tests.kits.ui_snapshots import make_tree, small_snapshot


def test_model_columns_of_the_small_tree():
    m = tree_model(small_snapshot())
    f = m.frame
    assert m.seq == 40 and m.n_nodes == 7 and m.total_tokens == 24
    assert f.index.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert f["parent_id"].tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert f["depth"].tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert f["tokens"].tolist() == [0, 8, 6, 4, 2, 1, 3]
    assert f["prefix_end"].tolist() == [0, 8, 6, 12, 10, 7, 15]
    assert f["subtree_tokens"].tolist() == [24, 17, 7, 7, 2, 1, 3]
    assert f["subtree_nodes"].tolist() == [7, 4, 2, 2, 1, 1, 1]
    assert f["n_children"].tolist() == [2, 2, 1, 1, 0, 0, 0]
    assert f["hits"].tolist() == [0, 3, 1, 2, 1, 1, 1]
    assert f["dev_full"].tolist() == [-1, 8, 6, 4, -1, 1, 3]
    assert f["host_mamba"].tolist() == [-1, -1, -1, -1, 1, -1, -1]
    assert f["lock_full"].tolist() == [0, 1, 0, 1, 0, 0, 0]
    assert f["href_full"].tolist() == [0, 0, 1, 0, 0, 0, 0]


def test_display_states_per_component():
    f = tree_model(small_snapshot()).frame
    assert list(f["state_full"]) == ["root", "locked", "in flight", "locked", "host-only",
                                     "device", "device+host"]
    # node 2's SWA is a tombstone over FULL device data (kept FULL); node 4's FULL is host-only
    assert list(f["state_swa"]) == ["root", "device", "tombstone, FULL kept", "locked",
                                    "tombstone", "device", "device+host"]
    # the backup moves FULL only: node 2's MAMBA state is plain device data
    assert list(f["state_mamba"]) == ["root", "tombstone", "device", "locked", "host-only",
                                      "tombstone", "tombstone"]


def test_children_sorted_by_subtree_then_id_and_paths():
    m = tree_model(small_snapshot())
    assert m.children(0) == [1, 2]
    assert m.children(1) == [3, 4]
    assert m.children(6) == []
    assert m.path_to_root(6) == [6, 3, 1, 0]
    assert m.path_to_root(0) == [0]
    ties = tree_model(make_tree([0, 0, 0], [5, 5, 9]))
    assert ties.children(0) == [3, 1, 2]


def test_state_summary_counts_nodes_and_own_tokens():
    m = tree_model(small_snapshot())
    s = state_summary(m, "full")
    assert s.to_dict("records") == [
        {"state": "in flight", "color": "#9b5de5", "nodes": 1, "tokens": 6},
        {"state": "locked", "color": "#e4572e", "nodes": 2, "tokens": 12},
        {"state": "device", "color": "#2a9d8f", "nodes": 1, "tokens": 1},
        {"state": "device+host", "color": "#3d6fb6", "nodes": 1, "tokens": 3},
        {"state": "host-only", "color": "#e9b949", "nodes": 1, "tokens": 2},
    ]
    assert state_summary(m, "mamba")[["state", "nodes"]].values.tolist() == [
        ["locked", 1], ["device", 1], ["host-only", 1], ["tombstone", 3]]


def test_node_ids_with_holes_and_labels():
    snap = small_snapshot()
    nodes = tuple(n for n in snap.nodes if n.node_id != 5)  # node 5 deleted: ids 0-4, 6
    two = dataclasses.replace(snap.nodes[2], node_id=2)
    snap = dataclasses.replace(snap, nodes=nodes[:2] + (two,) + nodes[3:])
    m = tree_model(snap)
    assert m.ids.tolist() == [0, 1, 2, 3, 4, 6]
    assert m.frame.at[2, "subtree_tokens"] == 6
    assert m.children(3) == [6]
    assert node_label(m, 6) == "#6 · 3 tok" and node_label(m, 0) == "root"


def test_bad_input_names_the_value():
    m = tree_model(small_snapshot())
    with pytest.raises(ValueError, match="node 99 is not in the tree at seq 40"):
        m.children(99)
    with pytest.raises(ValueError, match="'x' is not a node id"):
        m.row("x")
    with pytest.raises(ValueError, match="component 'kv' is not in this tree"):
        state_summary(m, "kv")
    snap = small_snapshot()
    orphan = dataclasses.replace(snap.nodes[6], parent_id=42)
    with pytest.raises(ValueError, match="node 6 has parent 42"):
        tree_model(dataclasses.replace(snap, nodes=snap.nodes[:6] + (orphan,)))
    loop = (dataclasses.replace(snap.nodes[3], parent_id=6),)
    with pytest.raises(ValueError, match="cycle"):
        tree_model(dataclasses.replace(snap, nodes=snap.nodes[:3] + loop + snap.nodes[4:]))
    with pytest.raises(ValueError, match="no root node 0"):
        tree_model(dataclasses.replace(snap, nodes=snap.nodes[1:]))


def test_display_state_rules():
    assert st_.display_state(
        ComponentState.on({"device": 4, "host": None}, {"device": 0, "host": 0})) == "device"
    assert st_.display_state(
        ComponentState.on({"device": 4, "host": 4}, {"device": 0, "host": 0})) == "device+host"
    assert st_.display_state(
        ComponentState.on({"device": None, "host": 4}, {"device": 0, "host": 0})) == "host-only"
    assert st_.display_state(
        ComponentState.on({"device": None, "host": None}, {"device": 0, "host": 0})) == "tombstone"
    assert st_.display_state(
        ComponentState.on({"device": None, "host": 4}, {"device": 0, "host": 2})) == "locked"
    assert st_.display_state(
        ComponentState.on({"device": 4, "host": 4}, {"device": 1, "host": 0}), in_flight=True) == "in flight"
    with pytest.raises(ValueError, match="unknown display state 'hot'"):
        st_.color_of("hot")
    html = st_.legend_html(["device", "tombstone"])
    assert html.count("<span title=") == 2 and "#2a9d8f" in html and "#d7dbe0" in html


def _with_storage(snap, stored: dict[int, tuple[int | None, ...]]):
    """``snap`` with L3 lengths per component set on the nodes in ``stored``."""
    nodes = []
    for nd in snap.nodes:
        if nd.node_id in stored:
            comps = tuple(ComponentState.on(
                {"device": s.length("device"), "host": s.length("host"), "storage": n},
                {"device": s.ref("device"), "host": s.ref("host")})
                for s, n in zip(nd.components, stored[nd.node_id], strict=True))
            nd = dataclasses.replace(nd, components=comps)
        nodes.append(nd)
    return dataclasses.replace(snap, nodes=tuple(nodes))


def test_storage_is_the_third_colour_per_component():
    # node 4: FULL host-only + L3, SWA only in L3, MAMBA host-only (not stored);
    # node 5: FULL device + L3; node 6: FULL and SWA device+host + L3; node 2 SWA: L3 over the
    # kept-FULL tombstone
    snap = _with_storage(small_snapshot(), {4: (8, 2, None), 5: (1, None, None),
                                            6: (3, 3, None), 2: (None, 4, None)})
    f = tree_model(snap).frame
    assert f["sto_full"].tolist() == [-1, -1, -1, -1, 8, 1, 3]
    assert f["sto_swa"].tolist() == [-1, -1, 4, -1, 2, -1, 3]
    assert f["sto_mamba"].tolist() == [-1] * 7
    assert list(f["state_full"]) == ["root", "locked", "in flight", "locked", "host+storage",
                                     "device+storage", "device+host+storage"]
    assert list(f["state_swa"]) == ["root", "device", "storage-only", "locked",
                                    "storage-only", "device", "device+host+storage"]
    assert list(f["state_mamba"]) == ["root", "tombstone", "device", "locked", "host-only",
                                      "tombstone", "tombstone"]
    summ = state_summary(tree_model(snap), "swa")
    row = summ[summ["state"] == "storage-only"].iloc[0]
    assert (row["nodes"], row["tokens"], row["color"]) == (2, 8, st_.COLORS[st_.STORAGE_ONLY])
    # every storage state has its own colour, distinct from every other state's
    assert len(set(st_.COLORS.values())) == len(st_.COLORS) == len(st_.STATES)
    for s in st_.STORED_STATES:
        assert s in st_.STATES and s in st_.MEANING


def test_display_state_with_storage():
    def cs(dev, host, sto, href=0):
        return ComponentState.on({"device": dev, "host": host, "storage": sto},
                                 {"host": href})
    assert st_.display_state(cs(4, 4, 4)) == st_.BOTH_STORED == "device+host+storage"
    assert st_.display_state(cs(4, None, 4)) == "device+storage"
    assert st_.display_state(cs(None, 4, 4)) == "host+storage"
    assert st_.display_state(cs(None, None, 4)) == "storage-only"
    assert st_.display_state(cs(None, None, 4), full_resident=True) == "storage-only"
    assert st_.display_state(cs(None, 4, 4, href=1)) == "locked"
    html = st_.legend_html(["device", "storage-only", "host+storage"])
    assert html.count("<span title=") == 3
    assert st_.COLORS[st_.STORAGE_ONLY] in html and st_.COLORS[st_.HOST_STORED] in html
    # a storage chip's rim is the storage colour
    assert html.count(f"border:1px solid {st_.COLORS[st_.STORAGE_ONLY]}") == 2
