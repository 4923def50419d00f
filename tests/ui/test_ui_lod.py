"""ui.shaping.lod: the level of detail, on a hand-built tree and a 100k-node synthetic one."""

from __future__ import annotations

import numpy as np
import pytest

from radixscope.ui.shaping.lod import lod_sectors, lod_summary, node_of_sector
from radixscope.ui.shaping.synthetic import synthetic_snapshot
from radixscope.ui.shaping.tree import tree_model
from tests.kits.ui_snapshots import WIDE_LENGTHS, WIDE_PARENTS, make_tree, small_snapshot


@pytest.fixture(scope="module")
def wide():
    return tree_model(make_tree(WIDE_PARENTS, WIDE_LENGTHS))


def test_everything_drawn_when_small(wide):
    s = lod_sectors(wide, min_share=0.0)
    assert s["sector"].tolist() == ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
    assert s["parent"].tolist() == ["", "0", "0", "0", "0", "0", "0", "1", "1", "7"]
    assert s["value"].tolist() == [129, 79, 30, 10, 5, 3, 2, 24, 5, 4]
    assert s["rel_depth"].tolist() == [0, 1, 1, 1, 1, 1, 1, 2, 2, 3]
    assert s["kind"].unique().tolist() == ["node"]
    assert s["hidden_nodes"].sum() == 0


def test_small_siblings_fold(wide):
    s = lod_sectors(wide, min_share=0.05)  # floor 6.45 tokens
    assert s["sector"].tolist() == ["0", "1", "2", "3", "7", "8", "9", "fold-0"]
    fold = s.iloc[-1]
    assert (fold["parent"], fold["value"], fold["folded"], fold["hidden_nodes"],
            fold["label"], fold["state_full"]) == ("0", 10, 3, 3, "+3 nodes / 10 tok", "folded")
    assert lod_summary(wide, s) == {"sectors": 8, "drawn_nodes": 7, "folded_nodes": 3,
                                    "nodes_below_window": 0, "subtree_nodes": 10}


def test_depth_window(wide):
    s = lod_sectors(wide, depth=1, min_share=0.05)
    assert s["sector"].tolist() == ["0", "1", "2", "3", "fold-0"]
    assert dict(zip(s["sector"], s["hidden_nodes"], strict=True)) == {
        "0": 0, "1": 3, "2": 0, "3": 0, "fold-0": 3}


def test_sector_budget(wide):
    s = lod_sectors(wide, max_sectors=4, min_share=0.0)
    assert s["sector"].tolist() == ["0", "1", "2", "fold-0"]
    assert s["value"].tolist() == [129, 79, 30, 20]
    assert s.iloc[-1]["folded"] == 4
    assert s.loc[s["sector"] == "1", "hidden_nodes"].item() == 3


def test_focus_below_the_root(wide):
    s = lod_sectors(wide, focus=1, min_share=0.0)
    assert s["sector"].tolist() == ["1", "7", "8", "9"]
    assert s["parent"].tolist() == ["", "1", "1", "7"]
    assert s["value"].tolist() == [79, 24, 5, 4]
    assert s["rel_depth"].tolist() == [0, 1, 1, 2]


def test_states_carried_per_component():
    s = lod_sectors(tree_model(small_snapshot()), min_share=0.0)
    assert s["sector"].tolist() == ["0", "1", "2", "3", "4", "5", "6"]
    assert s["state_full"].tolist() == ["root", "locked", "in flight", "locked", "host-only",
                                        "device", "device+host"]
    assert s["state_mamba"].tolist()[1:3] == ["tombstone", "device"]


def test_sector_ids_and_bad_parameters(wide):
    assert node_of_sector("17") == 17 and node_of_sector("fold-3") == 3
    with pytest.raises(ValueError, match="sector id 'x1'"):
        node_of_sector("x1")
    with pytest.raises(ValueError, match="node 42 is not in the tree"):
        lod_sectors(wide, focus=42)
    with pytest.raises(ValueError, match="depth=0"):
        lod_sectors(wide, depth=0)
    with pytest.raises(ValueError, match="max_sectors=1"):
        lod_sectors(wide, max_sectors=1)
    with pytest.raises(ValueError, match="min_share=1.5"):
        lod_sectors(wide, min_share=1.5)


@pytest.fixture(scope="module")
def big():
    return tree_model(synthetic_snapshot(100_000))


def _consistent(model, s) -> None:
    """Every sector id unique; every drawn child under a drawn parent; each parent's value is
    at least its drawn children's (plotly branchvalues='total'), and exactly their sum plus its
    own tokens when it was expanded (folds included)."""
    assert s["sector"].is_unique
    assert set(s["parent"][1:]) <= set(s["sector"])
    kids = s.iloc[1:].groupby("parent")["value"].sum()
    val = dict(zip(s["sector"], s["value"], strict=True))
    own = model.frame["tokens"]
    for parent, total in kids.items():
        assert val[parent] == total + own.at[int(parent)]


def test_lod_on_100k_nodes(big):
    assert big.n_nodes == 100_000 and big.total_tokens == 3_253_281
    s = lod_sectors(big)
    assert len(s) == 49
    assert s["value"].iat[0] == 3_253_281
    assert lod_summary(big, s) == {"sectors": 49, "drawn_nodes": 25, "folded_nodes": 99_975,
                                   "nodes_below_window": 0, "subtree_nodes": 100_000}
    _consistent(big, s)


def test_lod_on_100k_nodes_fine_detail_respects_the_budget(big):
    s = lod_sectors(big, depth=12, max_sectors=2000, min_share=0.0)
    assert len(s) == 2000
    _consistent_under_budget = s["sector"].is_unique and set(s["parent"][1:]) <= set(s["sector"])
    assert _consistent_under_budget
    assert (s["rel_depth"].diff().fillna(0)[s["kind"] == "node"] >= 0).all()  # breadth first
    s500 = lod_sectors(big, depth=12, max_sectors=500, min_share=0.0)
    assert len(s500) == 500


def test_lod_focus_inside_the_100k_tree(big):
    hub = big.children(0)[0]
    s = lod_sectors(big, focus=hub, depth=3, min_share=0.001)
    assert s["sector"].iat[0] == str(hub) and s["parent"].iat[0] == ""
    assert s["value"].iat[0] == big.frame.at[hub, "subtree_tokens"]
    assert len(s) <= 2000
    _consistent(big, s)
    assert np.all(s["rel_depth"] <= 3)
