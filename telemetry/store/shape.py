"""Checks of a tree read from a file before anything walks it.

A snapshot or journal from a store or a crash bundle is untrusted input: a parent cycle would
make a walk up the tree loop forever, a missing parent would raise ``KeyError`` deep inside a
page. ``check_tree`` verifies the shape in one pass over the nodes (linear time, no recursion)
and ``rebuild`` replays a journal onto a keyframe with every failure turned into one
``ValueError`` naming the file.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixscope.cache.snapshot import CacheSnapshot, replay

ROOT_ID = 0


def check_tree(snap: CacheSnapshot, where: str) -> CacheSnapshot:
    """``snap`` if its nodes form one tree rooted at node 0, else ``ValueError``.

    Args:
        snap: the snapshot.
        where: what it came from (a file and seq), for the message.

    Raises:
        ValueError: duplicate ids, no root or several, a parent that is not in the snapshot,
            or parent links that form a cycle.
    """
    parent: dict[int, int | None] = {}
    for n in snap.nodes:
        if n.node_id in parent:
            raise ValueError(f"{where}: node {n.node_id!r} appears twice")
        parent[n.node_id] = n.parent_id
    roots = [i for i, p in parent.items() if p is None]
    if roots != [ROOT_ID]:
        raise ValueError(f"{where}: the tree must have exactly one root, node {ROOT_ID}; it has "
                         f"{roots[:5]}")
    try:
        missing = [(i, p) for i, p in parent.items() if p is not None and p not in parent]
    except TypeError:  # an unhashable parent id (a list from a crafted journal)
        i, p = next((i, p) for i, p in parent.items() if p is not None and not _hashable(p))
        raise ValueError(f"{where}: node {i} has parent {p!r}, which is not a node id"
                         ) from None
    if missing:
        i, p = missing[0]
        raise ValueError(f"{where}: node {i} has parent {p!r}, which is not in the tree "
                         f"({len(missing)} such nodes)")
    reaches: dict[int, bool] = {ROOT_ID: True}
    for start in parent:
        path = []
        cur: int | None = start
        while cur is not None and cur not in reaches:
            reaches[cur] = False  # on the current path: meeting it again is a cycle
            path.append(cur)
            cur = parent[cur]
        if cur is not None and not reaches[cur]:
            raise ValueError(f"{where}: parent links form a cycle through node {cur} (nodes "
                             f"{path[:8]} never reach the root)")
        for i in path:
            reaches[i] = True
    return snap


def rebuild(start: CacheSnapshot, mutations: Iterable[tuple], where: str) -> CacheSnapshot:
    """Replay ``mutations`` onto ``start`` (both from a file) and check the result's shape.

    Raises:
        ValueError: the keyframe or the result is not a tree, or a mutation does not apply
            (names a node that does not exist, has a malformed value...).
    """
    check_tree(start, f"{where} (keyframe at seq {start.seq})")
    try:
        snap = replay(start, mutations)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{where}: the journal does not replay onto its keyframe "
                         f"({type(e).__name__}: {e})") from None
    return check_tree(snap, where)


def _hashable(v: object) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


__all__ = ["check_tree", "rebuild"]
