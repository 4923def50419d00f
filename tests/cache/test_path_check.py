"""A component's match rule is written twice: ``path_check``, inlined for match's hot loop (one
call a node, device and host runs at once), and ``valid_prefix``, the same rule on plain data
for readers of snapshots. These hold them to one another, and ``validator`` to both, on random
paths (random seeds in the long fuzz profile)."""

from __future__ import annotations

import os
import random
from array import array

import pytest
import torch

from radixscope.cache.components import rules
from radixscope.cache.components.base import ANY_OK, DEV_OK
from radixscope.cache.config import CacheConfig
from radixscope.cache.hiradix import HiRadixCache
from radixscope.cache.tiers import DEVICE, HOST
from radixscope.cache.tree import Node
from tests.kits.cachekit import make_config

LONG = os.environ.get("RADIXSCOPE_FUZZ") == "long"
SEEDS = [random.randrange(2**32) for _ in range(200)] if LONG else list(range(40))
_SLOT = torch.zeros(1, dtype=torch.int64)  # a value's content does not matter to the rule


def _config(page_size: int, window: int) -> CacheConfig:
    return make_config(("full", "swa", "mamba"), page_size=page_size, device_tokens=256,
                       host_tokens=256, sliding_window=window)


def _path(rng: random.Random, page_size: int, ci: int, n_comps: int) -> list[Node]:
    """Top-down nodes of whole pages, each with component ``ci`` on device, host only, both
    or neither."""
    out = []
    for i in range(rng.randint(1, 12)):
        node = Node(i + 1, None, array("q", [0] * page_size * rng.randint(1, 4)), None, n_comps)
        where = rng.choice(("device", "host", "both", "none"))
        v = node.data[ci].values
        v[DEVICE] = _SLOT if where in ("device", "both") else None
        v[HOST] = _SLOT if where in ("host", "both") else None
        out.append(node)
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_path_check_is_valid_prefix_and_validator(seed: int) -> None:
    rng = random.Random(seed)
    page, window = rng.choice((1, 2, 4)), rng.randint(1, 12)
    cache = HiRadixCache(_config(page, window))
    for comp in cache.comps:
        path = _path(rng, page, comp.index, len(cache.comps))
        check, on_dev, on_any = comp.path_check(), comp.validator(False), comp.validator(True)
        got = [check(n) for n in path]
        dev = [bool(on_dev(n)) for n in path]
        anyw = [bool(on_any(n)) for n in path]
        steps_dev = [(n.data[comp.index].values[DEVICE] is not None, len(n.key)) for n in path]
        steps_any = [(v[DEVICE] is not None or v[HOST] is not None, len(n.key))
                     for n in path for v in (n.data[comp.index].values,)]
        kw = {"window": window} if comp.has_window else {}
        want_dev = rules(comp.name).valid_prefix(steps_dev, **kw)
        want_any = rules(comp.name).valid_prefix(steps_any, **kw)
        assert [bool(r & DEV_OK) for r in got] == want_dev == dev, (comp.name, seed)
        assert [bool(r & ANY_OK) for r in got] == want_any == anyw, (comp.name, seed)


def test_swa_check_counts_host_data_only_in_its_any_run() -> None:
    """Device, host-only, device, device (window 4): the device run breaks at the host-only
    node and has 1, then 3 tokens after it (< 4); the device-or-host run never breaks (from the
    root it is unbounded)."""
    cache = HiRadixCache(_config(1, 4))
    swa = cache.comps[cache.ci["swa"]]
    nodes = []
    for i, (where, k) in enumerate((("device", 2), ("host", 2), ("device", 1), ("device", 2))):
        node = Node(i + 1, None, array("q", [0] * k), None, len(cache.comps))
        node.data[swa.index].values[DEVICE if where == "device" else HOST] = _SLOT
        nodes.append(node)
    check = swa.path_check()
    # from the root the runs are unbounded until the first gap in each
    assert [check(n) for n in nodes] == [DEV_OK | ANY_OK, ANY_OK, ANY_OK, ANY_OK]
    check = swa.path_check()  # a fresh check starts over
    assert check(nodes[1]) == ANY_OK
