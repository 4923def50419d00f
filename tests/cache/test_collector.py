"""The garbage collector and the tree (issue 17: no collector pauses in the hot path).

A FULL node is eight objects the collector could track: the node, its children dict, its key,
its ``data`` list, a ``ComponentData`` and that one's two lists, and the device value's
tensor. Five of them cannot be on a reference cycle, and the native ``untrack`` takes them off
the collector's lists, so a collection scans about three objects a node. These tests hold the
tree to that and check that a dropped cache is still freed: the node cycles (parent and
children) stay where the collector sees them. (What an untracked container refers to is never
freed by a collection, so content needs no test of its own here; the property tests read it
back.)
"""

from __future__ import annotations

import gc
import random
import weakref
from array import array

import pytest
import torch

from radixscope.cache import HiRadixCache, native
from tests.kits.cachekit import Driver, make_config

COMPONENTS = [("full",), ("full", "swa"), ("full", "swa", "mamba")]


def needs_native() -> None:
    if native.KERNELS != "native":
        pytest.skip("the native kernels were not built: the Python build keeps every object "
                    "tracked")


class Slotted:
    __slots__ = ("a",)


def test_untrack_takes_objects_off_the_collectors_lists() -> None:
    needs_native()
    objs = [[1, 2], array("Q", [3]), Slotted(), {"k": []}]
    assert all(gc.is_tracked(o) for o in objs)
    assert native.untrack(*objs) is None
    assert not any(gc.is_tracked(o) for o in objs)
    native.untrack(7, "text", None, *objs)  # untracked or never tracked: left as they are
    native.untrack()


def test_the_python_version_leaves_objects_tracked() -> None:
    objs = [[1], Slotted()]
    assert native.untrack_py(*objs) is None
    assert all(gc.is_tracked(o) for o in objs)


def _drive(components, seed: int, requests: int = 150):
    """A small cache driven into eviction, splits and write-through backups."""
    cache = HiRadixCache(make_config(components, device_tokens=96, host_tokens=192))
    d = Driver(cache, branching=True)
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 12))] for _ in range(4)]
    for i in range(requests):
        tokens = rng.choice(prompts) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 9))]
        cache.poll()  # write-through backups acked: their nodes evictable again
        short = len(tokens) - cache.available()
        if short > 0:
            cache.evict(short)
        for comp in components[1:]:
            want = len(tokens) if comp == "swa" else 2
            if cache.available(comp) < want:
                cache.evict(want - cache.available(comp), component=comp)
        d.insert(tokens, req_id=f"r{i}")
    return cache


@pytest.mark.parametrize("components", COMPONENTS, ids="+".join)
def test_a_node_leaves_only_itself_its_children_and_tensors_to_the_collector(components) -> None:
    needs_native()
    cache = _drive(components, seed=1)
    assert len(cache.tree.nodes) > 20
    for node in cache.tree.nodes.values():
        assert gc.is_tracked(node)
        assert not gc.is_tracked(node.key), f"node {node.id}: key tracked"
        assert not gc.is_tracked(node.data), f"node {node.id}: data list tracked"
        for d in node.data:
            assert not (gc.is_tracked(d) or gc.is_tracked(d.values) or gc.is_tracked(d.refs)), \
                f"node {node.id}: component data tracked"
    cache.check()


@pytest.mark.parametrize("components", COMPONENTS, ids="+".join)
def test_a_dropped_cache_is_freed_tree_and_tensors(components) -> None:
    """The tree is a web of cycles (parent and children); untracking must not hide one from
    the collector, or a dropped cache would keep its nodes and slot tensors for good."""
    cache = _drive(components, seed=4, requests=40)
    # a node cannot be weakly referenced: the slot tensors it alone holds stand for it
    values = [v for n in cache.tree.nodes.values() for d in n.data for v in d.values
              if isinstance(v, torch.Tensor)]
    assert len(values) > 10
    refs = [weakref.ref(cache), weakref.ref(cache.device_pools[0].buf),
            *(weakref.ref(v) for v in values)]
    del cache, values
    gc.collect()
    assert sum(r() is not None for r in refs) == 0


class _Owned(torch.Tensor):
    """A caller's tensor subclass that refers back to the cache and hands that reference on to
    what is made from it (``clone`` included), as wrappers that carry metadata do."""

    owner = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if isinstance(out, _Owned) and isinstance(args[0], _Owned):
            out.owner = args[0].owner
        return out


def test_a_callers_tensor_subclass_is_not_kept_by_the_tree() -> None:
    """A MAMBA slot handed in as a tensor subclass is stored as a plain tensor. Kept as given,
    it would sit in an untracked list and refer back to the cache: a cycle the collector never
    sees, so a dropped cache would never be freed."""
    cache = HiRadixCache(make_config(("full", "mamba"), device_tokens=64, host_tokens=0))
    tokens = list(range(1, 9))
    idx = cache.alloc(len(tokens))
    slot = cache.alloc(1, component="mamba").as_subclass(_Owned)
    slot.owner = cache
    cache.insert(tokens, idx, mamba_slot=slot)
    mi = cache.ci["mamba"]
    held = [v for n in cache.tree.nodes.values() for v in n.data[mi].values if v is not None]
    assert held and all(type(v) is torch.Tensor for v in held)
    cache.check()
    ref = weakref.ref(cache)
    del cache, slot, held
    gc.collect()
    assert ref() is None, "the dropped cache was kept alive through the caller's tensor"
