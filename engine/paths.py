"""Reading slot indices of a cached path for one component (what an attention kernel would read).

``HiRadixCache.path_indices`` gives FULL device indices; the sliding-window component needs the
last ``W`` positions' SWA slots behind a node, which this walks up the tree to collect (read-only:
no recency change, no records).
"""

from __future__ import annotations

import torch

from radixscope.cache.tiers import Tier


def window_indices(cache, node_id: int, component: str, tokens: int) -> tuple[int, torch.Tensor]:
    """Device slots of ``component`` for the last ``tokens`` positions of the path to ``node_id``.

    Returns ``(first_position, indices)``; fewer than ``tokens`` indices come back when a node on
    the way holds no device value for the component (the caller decides whether that is an error).
    """
    ci = cache.ci[component]
    node = cache.node(node_id)
    end = cache.node_prefix_len(node_id)
    parts: list[torch.Tensor] = []
    covered = 0
    while node.parent is not None and covered < tokens:
        value = node.data[ci].values[Tier.DEVICE]
        if value is None:
            break
        parts.append(value)
        covered += len(node.key)
        node = node.parent
    if not parts:
        return end, torch.empty(0, dtype=torch.int64)
    idx = torch.cat(parts[::-1])
    if covered > tokens:
        idx = idx[covered - tokens:]
        covered = tokens
    return end - covered, idx
