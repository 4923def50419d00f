"""ui.shaping.icicle: side-by-side icicles sharing one geometry, coloured per component."""

from __future__ import annotations

import pytest

from radixscope.ui.shaping import states as st_
from radixscope.ui.shaping.icicle import hover_data, icicle_figure, sector_colors
from radixscope.ui.shaping.lod import lod_sectors
from radixscope.ui.shaping.tree import tree_model
from tests.kits.ui_snapshots import WIDE_LENGTHS, WIDE_PARENTS, make_tree, small_snapshot


@pytest.fixture(scope="module")
def small():
    m = tree_model(small_snapshot())
    return m, lod_sectors(m, min_share=0.0)


def test_three_icicles_share_the_geometry(small):
    m, s = small
    fig = icicle_figure(m, s)
    assert [t.type for t in fig.data] == ["icicle"] * 3
    assert [t.name for t in fig.data] == ["full", "swa", "mamba"]
    for t in fig.data:
        assert list(t.ids) == ["0", "1", "2", "3", "4", "5", "6"]
        assert list(t.parents) == ["", "0", "0", "1", "1", "2", "3"]
        assert list(t.values) == [24, 17, 7, 7, 2, 1, 3]
        assert t.branchvalues == "total"
    c = st_.COLORS
    assert list(fig.data[0].marker.colors) == [c["root"], c["locked"], c["in flight"],
                                               c["locked"], c["host-only"], c["device"],
                                               c["device+host"]]
    assert list(fig.data[2].marker.colors) == [c["root"], c["tombstone"], c["device"],
                                               c["locked"], c["host-only"], c["tombstone"],
                                               c["tombstone"]]
    assert [a.text for a in fig.layout.annotations] == ["FULL", "SWA", "MAMBA"]


def test_one_component_and_hover(small):
    m, s = small
    fig = icicle_figure(m, s, ("swa",), height=300)
    assert len(fig.data) == 1 and fig.data[0].name == "swa" and fig.layout.height == 300
    hover = hover_data(m, s)
    assert hover[0][:3] == ["root", 0, 0]
    assert hover[3] == ["node #3", 4, 12,
                        "full: locked · swa: locked · mamba: locked",
                        "full lock 1 / host ref 0 swa lock 1 / host ref 0 mamba lock 1 / host "
                        "ref 0; last access 13, hits 2"]
    assert hover[2][4] == "full lock 0 / host ref 1; last access 12, hits 1"


def test_fold_sectors_are_drawn_plain():
    m = tree_model(make_tree(WIDE_PARENTS, WIDE_LENGTHS))
    s = lod_sectors(m, min_share=0.05)
    fig = icicle_figure(m, s)
    assert fig.data[0].ids[-1] == "fold-0"
    assert fig.data[0].marker.colors[-1] == st_.COLORS["folded"]
    assert fig.data[0].labels[-1] == "+3 nodes / 10 tok"
    assert hover_data(m, s)[-1][3] == "3 small sibling subtrees of #0"
    assert sector_colors(s, "full")[:2] == [st_.COLORS["root"], st_.COLORS["device"]]


def test_bad_components(small):
    m, s = small
    with pytest.raises(ValueError, match="component 'kv' is not in this tree"):
        icicle_figure(m, s, ("kv",))
    with pytest.raises(ValueError, match="nothing to draw"):
        icicle_figure(m, s.iloc[:0])
    with pytest.raises(ValueError, match="component 'kv' has no state column"):
        sector_colors(s, "kv")
