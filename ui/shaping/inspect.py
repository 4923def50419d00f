"""The node inspector: everything one snapshot knows about one node, as plain tables and text,
and its neighbourhood (path to the root, children) as a small graph rendered to DOT."""

from __future__ import annotations

import networkx as nx
import pandas as pd

from radixscope.cache import events as ev
from radixscope.cache.components import rules
from radixscope.cache.snapshot import CacheSnapshot
from radixscope.ui.shaping import states as st_
from radixscope.ui.shaping.tree import ROOT_ID, TreeModel


def node_facts(model: TreeModel, node_id: int) -> dict:
    """Scalar facts about a node: ids, depth, lengths, subtree, recency, hits, namespace."""
    i = model.row(node_id)
    r = model.frame.iloc[i]
    return {
        "node_id": int(node_id), "parent_id": int(r["parent_id"]), "depth": int(r["depth"]),
        "tokens": int(r["tokens"]), "prefix_start": int(r["prefix_end"] - r["tokens"]),
        "prefix_end": int(r["prefix_end"]), "subtree_tokens": int(r["subtree_tokens"]),
        "subtree_nodes": int(r["subtree_nodes"]), "children": int(r["n_children"]),
        "last_access": int(r["last_access"]), "hits": int(r["hits"]),
        "extra_key": r["extra_key"],
    }


def compact(n: int) -> str:
    """A count short enough for a metric tile: ``1,234``; ``141.6 k``; ``3.25 M``."""
    if abs(n) < 100_000:
        return f"{n:,}"
    return f"{n / 1e6:.2f} M" if abs(n) >= 1_000_000 else f"{n / 1e3:.1f} k"


def component_table(model: TreeModel, node_id: int) -> pd.DataFrame:
    """One row per component x tier: ``component, tier, resident, length, refs, state``.

    ``refs`` is the lock_ref on the device tier, the host_ref on the host tier and 0 in L3
    storage (nothing pins a stored page); ``state`` is the component's display state (the same
    on every row).
    """
    i = model.row(node_id)
    r = model.frame.iloc[i]
    rows = []
    for c in model.components:
        for tier, length, refs in ((ev.TIER_DEVICE, r[f"dev_{c}"], r[f"lock_{c}"]),
                                   (ev.TIER_HOST, r[f"host_{c}"], r[f"href_{c}"]),
                                   (ev.TIER_STORAGE, r[f"sto_{c}"], 0)):
            rows.append((c, tier, bool(length >= 0), int(max(length, 0)), int(refs),
                         str(r[f"state_{c}"])))
    return pd.DataFrame(rows, columns=["component", "tier", "resident", "length", "refs",
                                       "state"])


def state_notes(model: TreeModel, node_id: int) -> list[str]:
    """One plain sentence per component whose display state needs words (``FULL kept``
    tombstones, host-only data, data only in host and L3 or only in L3): ``"swa: tombstone, FULL kept - ..."``. A kept tombstone is
    explained by the component itself (``Component.tombstone_meaning``)."""
    r = model.frame.loc[node_id]
    out = []
    for c in model.components:
        s = str(r[f"state_{c}"])
        if s == st_.FULL_KEPT:
            out.append(f"{c}: {s} - {rules(c).tombstone_meaning}")
        elif s in (st_.HOST_ONLY, st_.HOST_STORED, st_.STORAGE_ONLY):
            out.append(f"{c}: {s} - {st_.MEANING[s]}")
    return out


def lock_holders(snap: CacheSnapshot, node_id: int) -> pd.DataFrame:
    """The locks pinning ``node_id``: ``receipt, owner, anchor, tier, components``."""
    rows = []
    for lk in snap.locks:
        comps = [c for c, ids in lk.pins if node_id in ids]
        if comps:
            rows.append((lk.receipt_id, lk.owner, lk.anchor, lk.tier, ", ".join(comps)))
    return pd.DataFrame(rows, columns=["receipt", "owner", "anchor", "tier", "components"])


def transfers_touching(snap: CacheSnapshot, node_id: int) -> pd.DataFrame:
    """Unacked transfers that include ``node_id``: ``transfer, kind, anchor, tier, amounts``."""
    rows = [(t.transfer_id, t.kind, t.anchor, t.tier,
             ", ".join(f"{c} {a}" for c, a in t.amounts))
            for t in snap.transfers if node_id in t.node_ids]
    return pd.DataFrame(rows, columns=["transfer", "kind", "anchor", "tier", "amounts"])


def token_preview(snap: CacheSnapshot, node_id: int, head: int = 12, tail: int = 4) -> str:
    """The node's token ids, shortened to ``head`` ... ``tail`` when long."""
    toks = snap.node(node_id).tokens
    if len(toks) <= head + tail:
        return " ".join(map(str, toks)) if toks else "(no tokens: the root)"
    return (" ".join(map(str, toks[:head])) + f" … ({len(toks) - head - tail} more) … "
            + " ".join(map(str, toks[-tail:])))


def neighbourhood(model: TreeModel, node_id: int, max_children: int = 8) -> nx.DiGraph:
    """The node's path to the root plus its largest ``max_children`` children (the rest as one
    ``+N more`` node). Node attributes: ``label``, ``kind`` (root / ancestor / focus / child /
    more), ``tokens`` and ``state_<c>`` per component."""
    path = model.path_to_root(node_id)
    g = nx.DiGraph()
    f = model.frame
    for k, nid in enumerate(path):
        kind = "focus" if k == 0 else ("root" if nid == ROOT_ID else "ancestor")
        _add(g, model, nid, kind)
        if k:
            g.add_edge(str(nid), str(path[k - 1]))
    kids = model.children(node_id)
    for c in kids[:max_children]:
        _add(g, model, c, "child")
        g.add_edge(str(node_id), str(c))
    rest = kids[max_children:]
    if rest:
        tok = int(f.loc[rest, "subtree_tokens"].sum())
        g.add_node("more", label=f"+{len(rest)} more\n{tok} tok", kind="more", tokens=tok,
                   **{f"state_{c}": st_.FOLDED for c in model.components})
        g.add_edge(str(node_id), "more")
    return g


def _add(g: nx.DiGraph, model: TreeModel, nid: int, kind: str) -> None:
    r = model.frame.loc[nid]
    label = "root" if nid == ROOT_ID else f"#{nid}\n{int(r['tokens'])} tok"
    g.add_node(str(nid), label=label, kind=kind, tokens=int(r["tokens"]),
               **{f"state_{c}": str(r[f"state_{c}"]) for c in model.components})


def to_dot(g: nx.DiGraph, component: str) -> str:
    """DOT text for ``st.graphviz_chart``: boxes filled with ``component``'s state colour, the
    focus drawn bold, laid out top (root) to bottom."""
    lines = ["digraph G {", '  rankdir=TB; bgcolor="transparent"; size="7,4.5"; nodesep=0.15;',
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [color="#868e96", arrowsize=0.6];']
    for n, a in g.nodes(data=True):
        state = a[f"state_{component}"]
        fill = st_.color_of(state)
        font = "white" if state in (st_.ROOT, st_.LOCKED, st_.IN_FLIGHT, st_.BOTH, st_.BOTH_STORED,
                                     st_.STORAGE_ONLY) else "black"
        pen = ", penwidth=3" if a["kind"] == "focus" else ""
        plain = a["kind"] in ("root", "more") or state == st_.ROOT
        label = a["label"].replace('"', "'") + ("" if plain else f"\n{state}")
        lines.append(f'  "{n}" [label="{_esc(label)}", fillcolor="{fill}", '
                     f'fontcolor="{font}"{pen}];')
    for u, v in g.edges():
        lines.append(f'  "{u}" -> "{v}";')
    lines.append("}")
    return "\n".join(lines)


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n")
