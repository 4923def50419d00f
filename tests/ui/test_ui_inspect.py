"""ui.shaping.inspect: the node inspector's tables, the token preview and the path graph."""

from __future__ import annotations

import pytest

from radixscope.ui.shaping.inspect import (
    compact,
    component_table,
    lock_holders,
    neighbourhood,
    node_facts,
    to_dot,
    token_preview,
    transfers_touching,
)
from radixscope.ui.shaping.tree import tree_model
from tests.kits.ui_snapshots import small_snapshot


@pytest.fixture(scope="module")
def snap():
    return small_snapshot()


@pytest.fixture(scope="module")
def model(snap):
    return tree_model(snap)


def test_node_facts(model):
    assert node_facts(model, 3) == {
        "node_id": 3, "parent_id": 1, "depth": 2, "tokens": 4, "prefix_start": 8,
        "prefix_end": 12, "subtree_tokens": 7, "subtree_nodes": 2, "children": 1,
        "last_access": 13, "hits": 2, "extra_key": None}


def test_component_table_per_tier(model):
    t = component_table(model, 2)
    assert t.values.tolist() == [
        ["full", "device", True, 6, 0, "in flight"],
        ["full", "host", True, 6, 1, "in flight"],
        ["full", "storage", False, 0, 0, "in flight"],
        ["swa", "device", False, 0, 0, "tombstone, FULL kept"],
        ["swa", "host", False, 0, 0, "tombstone, FULL kept"],
        ["swa", "storage", False, 0, 0, "tombstone, FULL kept"],
        ["mamba", "device", True, 1, 0, "device"],
        ["mamba", "host", False, 0, 0, "device"],
        ["mamba", "storage", False, 0, 0, "device"],
    ]


def test_component_table_shows_the_storage_tier():
    import dataclasses

    from radixscope.cache.snapshot import ComponentState
    snap = small_snapshot()
    nodes = list(snap.nodes)
    nd = nodes[4]  # FULL host-only (2 tokens), now also in L3
    full = nd.components[0]
    stored = ComponentState.on({"host": full.length("host"), "storage": 2}, {})
    nodes[4] = dataclasses.replace(nd, components=(stored, *nd.components[1:]))
    t = component_table(tree_model(dataclasses.replace(snap, nodes=tuple(nodes))), 4)
    assert t.values.tolist()[:3] == [["full", "device", False, 0, 0, "host+storage"],
                                     ["full", "host", True, 2, 0, "host+storage"],
                                     ["full", "storage", True, 2, 0, "host+storage"]]


def test_lock_holders_and_transfers(snap):
    assert lock_holders(snap, 3).values.tolist() == [[7, "req-a", 3, "device",
                                                      "full, swa, mamba"]]
    assert lock_holders(snap, 1).values.tolist() == [[7, "req-a", 3, "device", "full"]]
    assert lock_holders(snap, 4).empty
    assert transfers_touching(snap, 2).values.tolist() == [[9, "backup", 2, "host", "full 6"]]
    assert transfers_touching(snap, 1).empty


def test_token_preview(snap):
    assert token_preview(snap, 3) == "9 10 11 12"
    assert token_preview(snap, 0) == "(no tokens: the root)"
    assert token_preview(snap, 1, head=3, tail=2) == "1 2 3 … (3 more) … 7 8"


def test_neighbourhood_graph_and_dot(model):
    g = neighbourhood(model, 3)
    assert sorted(g.nodes) == ["0", "1", "3", "6"]
    assert sorted(g.edges) == [("0", "1"), ("1", "3"), ("3", "6")]
    assert g.nodes["3"]["kind"] == "focus" and g.nodes["6"]["kind"] == "child"
    assert g.nodes["1"]["state_full"] == "locked"
    dot = to_dot(g, "full")
    assert dot.startswith("digraph G {") and dot.endswith("}")
    assert '"3" [label="#3\\n4 tok\\nlocked", fillcolor="#e4572e", fontcolor="white", ' \
           'penwidth=3];' in dot
    assert '"0" [label="root", fillcolor="#343a40", fontcolor="white"];' in dot
    assert '"1" -> "3";' in dot


def test_neighbourhood_folds_extra_children(model):
    g = neighbourhood(model, 0, max_children=1)
    assert sorted(g.nodes) == ["0", "1", "more"]
    assert g.nodes["more"]["label"] == "+1 more\n7 tok"
    assert '"more" [label="+1 more\\n7 tok", fillcolor="#f1f3f5"' in to_dot(g, "swa")


def test_compact_counts():
    assert [compact(n) for n in (0, 99_999, 141_563, 3_253_281, -2_500_000)] == [
        "0", "99,999", "141.6 k", "3.25 M", "-2.50 M"]
