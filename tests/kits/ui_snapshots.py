"""Hand-built snapshots with known numbers for the UI shaping tests.

``small_snapshot()`` (FULL + SWA + MAMBA, seq 40)::

    0 root
    ├── 1  8 tok  full dev+host (lock 1)  swa device        mamba -
    │   ├── 3  4 tok  full device (lock 1) swa device (lock) mamba device (lock)
    │   │   └── 6  3 tok  full dev+host     swa dev+host      mamba -
    │   └── 4  2 tok  full host-only       swa -             mamba host-only
    └── 2  6 tok  full dev+host (host ref 1, backup 9 in flight)  swa -  mamba device
        └── 5  1 tok  full device          swa device        mamba -

Lock 7 (owner ``req-a``) pins full (3, 1), swa (3,), mamba (3,); transfer 9 backs node 2 up.
"""

from __future__ import annotations

from radixscope.cache.snapshot import (
    CacheSnapshot,
    ComponentState,
    LockSnapshot,
    NodeSnapshot,
    PoolSnapshot,
    TransferSnapshot,
)


def C(dev, host, lock, href) -> ComponentState:  # noqa: N802 - reads as a constructor
    """A component state from its device / host lengths and refs (other tiers empty)."""
    return ComponentState.on({"device": dev, "host": host}, {"device": lock, "host": href})
NONE = C(None, None, 0, 0)
COMPS3 = ("full", "swa", "mamba")


def small_snapshot(seq: int = 40) -> CacheSnapshot:
    nodes = (
        NodeSnapshot(0, None, None, (), 0, 0, (NONE, NONE, NONE)),
        NodeSnapshot(1, 0, None, tuple(range(1, 9)), 11, 3, (C(8, 8, 1, 0), C(8, None, 0, 0),
                                                             NONE)),
        NodeSnapshot(2, 0, None, tuple(range(20, 26)), 12, 1, (C(6, 6, 0, 1), NONE,
                                                               C(1, None, 0, 0))),
        NodeSnapshot(3, 1, None, (9, 10, 11, 12), 13, 2, (C(4, None, 1, 0), C(4, None, 1, 0),
                                                          C(1, None, 1, 0))),
        NodeSnapshot(4, 1, None, (30, 31), 5, 1, (C(None, 2, 0, 0), NONE, C(None, 1, 0, 0))),
        NodeSnapshot(5, 2, None, (40,), 9, 1, (C(1, None, 0, 0), C(1, None, 0, 0), NONE)),
        NodeSnapshot(6, 3, None, (13, 14, 15), 14, 1, (C(3, 3, 0, 0), C(3, 3, 0, 0), NONE)),
    )
    pools = (
        PoolSnapshot("full", "device", 32, 8, 10, 12, 0),
        PoolSnapshot("full", "host", 64, 45, 13, 6, 6),
        PoolSnapshot("swa", "device", 16, 0, 12, 4, 0),
        PoolSnapshot("swa", "host", 16, 13, 3, 0, 0),
        PoolSnapshot("mamba", "device", 4, 2, 1, 1, 0),
        PoolSnapshot("mamba", "host", 4, 3, 1, 0, 0),
    )
    locks = (LockSnapshot(7, "req-a", 3, "device",
                          (("full", (3, 1)), ("swa", (3,)), ("mamba", (3,)))),)
    transfers = (TransferSnapshot(9, "backup", 2, "host", (2,), (("full", 6),)),)
    return CacheSnapshot(seq, 1, COMPS3, nodes, pools, locks, transfers)


def make_tree(parents: list[int], lengths: list[int], seq: int = 1) -> CacheSnapshot:
    """A FULL-only snapshot: node ``i + 1`` has parent ``parents[i]`` and ``lengths[i]``
    tokens, all on the device; pools sized to fit exactly."""
    nodes = [NodeSnapshot(0, None, None, (), 0, 0, (NONE,))]
    tok = 100
    for i, (p, k) in enumerate(zip(parents, lengths, strict=True)):
        nodes.append(NodeSnapshot(i + 1, p, None, tuple(range(tok, tok + k)), i + 1, 0,
                                  (C(k, None, 0, 0),)))
        tok += k
    total = sum(lengths)
    pools = (PoolSnapshot("full", "device", total, 0, total, 0, 0),
             PoolSnapshot("full", "host", 0, 0, 0, 0, 0))
    return CacheSnapshot(seq, 1, ("full",), tuple(nodes), pools, (), ())


# root children 1..6 (50, 30, 10, 5, 3, 2 tok); 7 (20) and 8 (5) under 1; 9 (4) under 7.
WIDE_PARENTS = [0, 0, 0, 0, 0, 0, 1, 1, 7]
WIDE_LENGTHS = [50, 30, 10, 5, 3, 2, 20, 5, 4]
