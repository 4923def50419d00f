"""The tree as plotly icicles: one per component, side by side on the same geometry.

Every icicle gets the same ``ids`` / ``parents`` / ``values`` (so sector ``#12`` sits in the same
place in each), and its own colours: the display state of that component. Hover shows every
component's state, the refs, recency and hits of the node.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from radixscope.ui.shaping import states as st_
from radixscope.ui.shaping.lod import KIND_FOLD
from radixscope.ui.shaping.tree import TreeModel

HOVER = ("<b>%{customdata[0]}</b><br>%{value} tokens in subtree (own %{customdata[1]})"
         "<br>prefix ends at token %{customdata[2]}<br>%{customdata[3]}<br>%{customdata[4]}"
         "<extra>%{fullData.name}</extra>")


def sector_colors(sectors: pd.DataFrame, component: str) -> list[str]:
    """Fill colour per sector for ``component`` (its ``state_<c>`` column)."""
    col = f"state_{component}"
    if col not in sectors.columns:
        raise ValueError(f"component {component!r} has no state column in these sectors")
    return [st_.color_of(s) for s in sectors[col]]


def hover_data(model: TreeModel, sectors: pd.DataFrame) -> list[list]:
    """Per sector: title, own tokens, prefix end, states line, refs/recency line."""
    f = model.frame
    comps = model.components
    is_node = (sectors["kind"] != KIND_FOLD).to_numpy()
    nid = sectors["node_id"].to_numpy()
    pos = np.searchsorted(model.ids, np.where(is_node, nid, 0))
    col = {name: f[name].to_numpy()[pos] for name in ("tokens", "prefix_end", "last_access",
                                                       "hits")}
    refs = {c: (f["lock_" + c].to_numpy()[pos], f["href_" + c].to_numpy()[pos]) for c in comps}
    state = {c: sectors["state_" + c].tolist() for c in comps}
    folded, parent, label = (sectors["folded"].tolist(), sectors["parent_node"].tolist(),
                             sectors["label"].tolist())
    hidden = sectors["hidden_nodes"].tolist()
    out = []
    for i in range(len(sectors)):
        if not is_node[i]:
            out.append([label[i], 0, "-", f"{folded[i]} small sibling subtrees of #{parent[i]}",
                        "click: focus the parent, then pick one in the table"])
            continue
        states = " · ".join(f"{c}: {state[c][i]}" for c in comps)
        locks = " ".join(f"{c} lock {refs[c][0][i]} / host ref {refs[c][1][i]}"
                         for c in comps if refs[c][0][i] or refs[c][1][i])
        extra = f"last access {col['last_access'][i]}, hits {col['hits'][i]}"
        if hidden[i]:
            extra += f"; {hidden[i]} nodes below not drawn"
        out.append(["root" if nid[i] == 0 else f"node #{nid[i]}", int(col["tokens"][i]),
                    int(col["prefix_end"][i]), states, (locks + "; " if locks else "") + extra])
    return out


def icicle_figure(model: TreeModel, sectors: pd.DataFrame,
                  components: tuple[str, ...] | None = None, height: int = 620) -> go.Figure:
    """Side-by-side icicles (one per component) over the same sectors.

    Args:
        model: the tree the sectors came from.
        sectors: ``lod.lod_sectors`` output.
        components: which components to draw, in order; default all of the model's.
        height: figure height in pixels.

    Raises:
        ValueError: a component the model does not have, or no sectors.
    """
    comps = tuple(model.components if components is None else components)
    for c in comps:
        if c not in model.components:
            raise ValueError(f"component {c!r} is not in this tree; have "
                             f"{list(model.components)}")
    if not comps or sectors.empty:
        raise ValueError("nothing to draw: no components or no sectors")
    ids = sectors["sector"].tolist()
    parents = sectors["parent"].tolist()
    values = sectors["value"].tolist()
    labels = sectors["label"].tolist()
    custom = hover_data(model, sectors)
    fig = make_subplots(rows=1, cols=len(comps), specs=[[{"type": "domain"}] * len(comps)],
                        subplot_titles=[c.upper() for c in comps], horizontal_spacing=0.01)
    for i, c in enumerate(comps):
        fig.add_trace(go.Icicle(
            ids=ids, parents=parents, values=values, labels=labels, branchvalues="total",
            name=c, marker={"colors": sector_colors(sectors, c),
                            "line": {"color": "#ffffff", "width": 0.6}},
            customdata=custom, hovertemplate=HOVER, texttemplate="%{label}<br>%{value} tok",
            tiling={"orientation": "h", "pad": 0}, pathbar={"visible": False}, sort=True,
            insidetextfont={"size": 11}, root={"color": st_.COLORS[st_.ROOT]}),
            row=1, col=i + 1)
    fig.update_layout(height=height, margin={"l": 4, "r": 4, "t": 28, "b": 4},
                      uirevision="tree", clickmode="event")
    return fig
