"""Server-side level of detail: which sectors of the tree to draw.

A browser draws one SVG path per icicle sector and slows down past a few thousand, while a cache
tree can hold 10^5 nodes. ``lod_sectors`` picks what to draw below a focus node:

* a depth window: at most ``depth`` levels below the focus;
* a width floor: a child whose subtree holds less than ``min_share`` of the focus's tokens is
  not drawn on its own; such small siblings are folded into one ``+N nodes / T tok`` sector
  (a lone small child is drawn as itself: one sector either way);
* a budget: at most ``max_sectors`` sectors, filled breadth-first (largest subtrees first), so
  the shallow levels are always complete.

Every drawn node's value is its whole subtree's tokens (plotly ``branchvalues="total"``), so widths
stay true even where descendants are not drawn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from radixscope.ui.shaping import states as st_
from radixscope.ui.shaping.tree import ROOT_ID, TreeModel

FOLD_PREFIX = "fold-"
KIND_NODE = "node"
KIND_FOLD = "fold"

COLUMNS = ("sector", "parent", "node_id", "parent_node", "kind", "rel_depth", "value",
           "folded", "hidden_nodes", "label")


def lod_sectors(model: TreeModel, focus: int = ROOT_ID, depth: int = 6,
                max_sectors: int = 2000, min_share: float = 0.002) -> pd.DataFrame:
    """The sectors to draw for ``focus`` (see the module docstring).

    Args:
        model: the tree.
        focus: the node drawn as the figure's root.
        depth: levels below the focus, >= 1.
        max_sectors: the most sectors drawn, >= 2.
        min_share: smallest subtree, as a share of the focus's tokens, drawn on its own.

    Returns:
        One row per sector, parents before children, with ``COLUMNS`` plus ``state_<c>`` per
        component (``folded`` for fold sectors). ``sector``/``parent`` are plotly ids (the node
        id as text, or ``fold-<parent id>``); ``value`` is tokens; ``folded`` the siblings a fold
        holds; ``hidden_nodes`` nodes under the sector that are not drawn.

    Raises:
        ValueError: an unknown focus or out-of-range parameters, naming the value.
    """
    frow = model.row(focus)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth={depth!r}: must be an int >= 1")
    if isinstance(max_sectors, bool) or not isinstance(max_sectors, int) or max_sectors < 2:
        raise ValueError(f"max_sectors={max_sectors!r}: must be an int >= 2")
    if not 0 <= min_share < 1:
        raise ValueError(f"min_share={min_share!r}: must be in [0, 1)")
    f = model.frame
    sub_tok = f["subtree_tokens"].to_numpy()
    sub_n = f["subtree_nodes"].to_numpy()
    order, start = model.child_order, model.child_start
    floor = min_share * sub_tok[frow]
    node_rows: list[int] = [frow]  # row positions of drawn nodes
    node_depth: list[int] = [0]
    expanded: set[int] = set()
    folds: list[tuple[int, int, int, int, int]] = []  # parent row, depth, n, tokens, nodes
    count = 1
    frontier = [frow]
    for d in range(1, depth + 1):
        nxt: list[int] = []
        for p in frontier:
            kids = order[start[p]:start[p + 1]]
            if len(kids) == 0:
                continue
            if count >= max_sectors:
                break
            expanded.add(p)
            j = 0
            while j < len(kids):
                c = kids[j]
                last = j == len(kids) - 1
                if sub_tok[c] < floor and not last:
                    break
                if count + 1 + (0 if last else 1) > max_sectors:
                    break
                node_rows.append(int(c))
                node_depth.append(d)
                nxt.append(int(c))
                count += 1
                j += 1
            rest = kids[j:]
            if len(rest) == 1 and count < max_sectors:
                node_rows.append(int(rest[0]))
                node_depth.append(d)
                nxt.append(int(rest[0]))
                count += 1
            elif len(rest) > 1:
                folds.append((p, d, len(rest), int(sub_tok[rest].sum()), int(sub_n[rest].sum())))
                count += 1
        frontier = nxt
        if not frontier:
            break
    return _frame(model, node_rows, node_depth, expanded, folds)


def _frame(model: TreeModel, rows: list[int], depths: list[int], expanded: set[int],
           folds: list[tuple[int, int, int, int, int]]) -> pd.DataFrame:
    f = model.frame
    ids = model.ids
    r = np.asarray(rows, dtype=np.int64)
    node_ids = ids[r]
    parent_ids = f["parent_id"].to_numpy()[r]
    is_exp = np.fromiter((x in expanded for x in rows), dtype=bool, count=len(rows))
    hidden = np.where(is_exp, 0, f["subtree_nodes"].to_numpy()[r] - 1)
    sector = [str(i) for i in node_ids.tolist()]
    parent = [""] + [str(i) for i in parent_ids[1:].tolist()]
    labels = ["root" if i == ROOT_ID else f"#{i}" for i in node_ids.tolist()]
    out = {
        "sector": sector, "parent": parent, "node_id": node_ids,
        "parent_node": np.concatenate(([-1], parent_ids[1:])).astype(np.int64),
        "kind": [KIND_NODE] * len(rows), "rel_depth": depths,
        "value": f["subtree_tokens"].to_numpy()[r], "folded": np.zeros(len(rows), np.int64),
        "hidden_nodes": hidden, "label": labels,
    }
    for c in model.components:
        out[f"state_{c}"] = f[f"state_{c}"].to_numpy()[r].astype(object)
    nodes = pd.DataFrame(out)
    if not folds:
        return nodes
    fold_rows = []
    for p, d, n, tok, nn in folds:
        pid = int(ids[p])
        fold_rows.append({"sector": f"{FOLD_PREFIX}{pid}", "parent": str(pid), "node_id": -1,
                          "parent_node": pid, "kind": KIND_FOLD, "rel_depth": d, "value": tok,
                          "folded": n, "hidden_nodes": nn, "label": f"+{nn} nodes / {tok} tok",
                          **{f"state_{c}": st_.FOLDED for c in model.components}})
    return pd.concat([nodes, pd.DataFrame(fold_rows)], ignore_index=True)


def node_of_sector(sector: str) -> int:
    """The node a clicked sector stands for (a fold stands for its parent).

    Raises:
        ValueError: not a sector id made by ``lod_sectors``.
    """
    s = str(sector)
    if s.startswith(FOLD_PREFIX):
        s = s[len(FOLD_PREFIX):]
    try:
        return int(s)
    except ValueError:
        raise ValueError(f"sector id {sector!r} is neither a node id nor "
                         f"'{FOLD_PREFIX}<node id>'") from None


def lod_summary(model: TreeModel, sectors: pd.DataFrame) -> dict:
    """Counts for a caption: sectors, nodes drawn, nodes in folds, nodes below the window."""
    nodes = sectors[sectors["kind"] == KIND_NODE]
    focus_nodes = int(model.frame["subtree_nodes"].iat[model.row(int(nodes["node_id"].iat[0]))])
    folded = int(sectors.loc[sectors["kind"] == KIND_FOLD, "hidden_nodes"].sum())
    below = int(nodes["hidden_nodes"].sum())
    return {"sectors": len(sectors), "drawn_nodes": len(nodes), "folded_nodes": folded,
            "nodes_below_window": below, "subtree_nodes": focus_nodes}
