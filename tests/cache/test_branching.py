"""Branching points: a conversation that splits off a shared prompt fills in the SWA window /
MAMBA state at the split (``MatchResult.branch_len`` -> ``insert(branch_len=...,
mamba_branch_slot=...)``), so the next conversation over that prompt matches it, as SGLang's
``swa_branching_seqlen`` / ``mamba_branching_seqlen`` do. Without it a hybrid cache reuses none
of a shared system prompt: the prompt's end is a split node with no window and no state."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.events import FlightRecorder, named_op
from radixscope.cache.tiers import Tier
from radixscope.telemetry.store.span_attrs import span_attributes
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config, state_for

PROMPT = list(range(100, 112))  # 12 tokens shared by every conversation


def cache_for(components, page_size: int = 1) -> tuple[HiRadixCache, Driver]:
    c = HiRadixCache(make_config(components, page_size=page_size, device_tokens=128,
                                 host_tokens=0, sliding_window=4, mamba_slots=16))
    return c, Driver(c)


def conv(i: int, page_size: int = 1) -> list[int]:
    return [t for t in PROMPT + [1000 * (i + 1) + j for j in range(4)] for _ in range(page_size)]


def path_has(c: HiRadixCache, comp: str, node_id: int) -> list[tuple[int, int, bool]]:
    """(start, end, has device data of ``comp``) for each node on the root path to node_id."""
    ci = c.ci[comp]
    out, off = [], 0
    for x in c.tree.path_to_root(c.node(node_id))[::-1]:
        out.append((off, off + len(x.key), x.data[ci].values[Tier.DEVICE] is not None))
        off += len(x.key)
    return out


@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_the_conversation_after_a_branch_reuses_the_shared_prompt(components, page_size):
    c, d = cache_for(components, page_size)
    shared = len(PROMPT) * page_size
    d.insert(conv(0, page_size), branching=True)
    m = c.match_prefix(conv(1, page_size))
    hybrid = len(components) > 1
    # FULL alone reuses the prompt at once; a hybrid has no window / state at its end yet
    assert (m.device_prefix_len, m.branch_len) == ((0, shared) if hybrid else (shared, 0))
    res = d.insert(conv(1, page_size), branching=True)
    if hybrid:
        assert c.tree.prefix_len(c.node(res.branch_node)) == shared
    for i in (2, 3):
        key = conv(i, page_size)
        m = c.match_prefix(key)
        assert (m.device_prefix_len, m.branch_len) == (shared, 0), i
        assert d.verify_device_prefix(key, m.last_device_node) == shared  # content, every comp
        d.insert(key, branching=True)
    c.check()


@pytest.mark.parametrize("components", COMBOS[1:], ids=COMBO_IDS[1:])
def test_without_the_branching_point_a_hybrid_reuses_none_of_the_prompt(components):
    c, d = cache_for(components)
    for i in range(3):
        d.insert(conv(i))  # the match's branch_len ignored
    m = c.match_prefix(conv(3))
    assert (m.device_prefix_len, m.branch_len) == (0, len(PROMPT))


def test_the_swa_window_behind_the_branch_is_kept_and_nothing_below_it():
    c, d = cache_for(("full", "swa"))
    d.insert(conv(0), branching=True)
    res = d.insert(conv(1), branching=True)
    have = path_has(c, "swa", res.branch_node)
    # window 4: SWA on [8, 12) (the branch's window); [0, 8) FULL only
    assert [(a, b) for a, b, on in have if on] == [(8, 12)]
    assert all(not on for a, b, on in have if b <= 8)
    c.check()


def test_a_branch_inside_the_keys_last_window_keeps_one_range():
    """Branch at 12 of a 14-token key, window 4: the two windows meet, [8, 14) keeps SWA, cut
    at the branch (a node ends there)."""
    c, d = cache_for(("full", "swa"))
    d.insert(PROMPT + [1, 2], branching=True)
    res = d.insert(PROMPT + [3, 4], branching=True)
    assert c.tree.prefix_len(c.node(res.branch_node)) == 12
    have = path_has(c, "swa", res.last_node)
    # [10, 14) kept SWA from the first insert; [8, 10) healed by the second; [0, 8) none
    assert [(a, b) for a, b, on in have if on] == [(8, 10), (10, 12), (12, 14)]
    c.check()


def test_the_mamba_state_at_the_branch_is_the_callers_and_an_existing_one_is_kept():
    c, d = cache_for(("full", "mamba"))
    mi = c.ci["mamba"]
    d.insert(conv(0), branching=True)
    # two requests matched before either inserted: both are told to branch at 12
    keys = [conv(1), conv(2)]
    ms = [c.match_prefix(k) for k in keys]
    assert [m.branch_len for m in ms] == [len(PROMPT)] * 2
    free = c.available("mamba")
    results = []
    for key, m in zip(keys, ms, strict=True):
        slots = c.alloc(2, component="mamba")
        for slot, end in zip(slots.split(1), (len(key), len(PROMPT)), strict=True):
            c.device_pools[mi].write(slot, state_for(key, end, c.device_pools[mi].buf.shape[1:]))
        results.append(c.insert(key, c.alloc(len(key)), mamba_slot=slots[:1],
                                mamba_branch_slot=slots[1:], branch_len=m.branch_len))
    first, second = results
    assert not first.mamba_branch_exist and second.mamba_branch_exist
    assert first.branch_node == second.branch_node
    assert c.available("mamba") == free - 3  # two end states and the first branch state
    node = c.node(first.branch_node)
    want = state_for(keys[0], len(PROMPT), c.device_pools[mi].buf.shape[1:])
    assert torch.equal(c.device_pools[mi].read(node.data[mi].values[Tier.DEVICE]), want)
    c.check()


@pytest.fixture
def pending():
    """A hybrid cache whose next insert (conv 1) has a branching point at 12, with its slots."""
    c, d = cache_for(("full", "swa", "mamba"), page_size=2)
    d.insert(conv(0, 2), branching=True)
    key = conv(1, 2)
    m = c.match_prefix(key)
    n = len(key)
    held = {"full": c.alloc(n), "swa": c.alloc(n, component="swa"),
            "mamba": c.alloc(2, component="mamba")}
    return c, key, m, held


def _bad_calls(key, m, held) -> dict:
    """case -> (insert keywords on top of the good call's, error, text the error names)."""
    n = len(key)
    one = held["mamba"][1:]
    return {
        "negative": (dict(branch_len=-2), ValueError, "branch_len=-2"),
        "bool": (dict(branch_len=True), ValueError, "branch_len=True"),
        "unaligned": (dict(branch_len=5), ValueError, "branch_len=5 must be page-aligned"),
        "past the key": (dict(branch_len=n + 2), ValueError, f"branch_len={n + 2} must be 0"),
        "at the end with a state": (dict(branch_len=n, mamba_branch_slot=one), ValueError,
                                    "short of the key's end"),
        "no branch with a state": (dict(mamba_branch_slot=one), ValueError,
                                   "short of the key's end"),
        "same slot": (dict(branch_len=m.branch_len, mamba_branch_slot=held["mamba"][:1]),
                      ValueError, "the same slot"),
        "not held": (dict(branch_len=m.branch_len,
                          mamba_branch_slot=torch.tensor([15], dtype=torch.int64)),
                     ValueError, "mamba_branch_slot: slots [15] are not allocated"),
    }


@pytest.mark.parametrize("case", ["negative", "bool", "unaligned", "past the key",
                                  "at the end with a state", "no branch with a state",
                                  "same slot", "not held"])
def test_a_bad_branching_point_is_rejected_before_any_change(pending, case):
    c, key, m, held = pending
    kw, exc, needle = _bad_calls(key, m, held)[case]
    base = dict(swa_indices=held["swa"], mamba_slot=held["mamba"][:1])
    before = c.snapshot()
    with pytest.raises(exc) as info:
        c.insert(key, held["full"], **base, **kw)
    assert needle in str(info.value)
    assert c.snapshot() == before
    # and the same slots still insert cleanly
    c.insert(key, held["full"], branch_len=m.branch_len, mamba_branch_slot=held["mamba"][1:],
             **base)
    c.check()


def test_a_branching_point_at_or_below_the_reused_prefix_is_rejected():
    c, d = cache_for(("full", "swa"))
    d.insert(conv(0))
    key = conv(0) + [5, 6]
    m = c.match_prefix(key)
    assert m.device_prefix_len == 16
    idx = c.alloc(2)
    swa = torch.cat([torch.full((16,), -1, dtype=torch.int64), c.alloc(2, component="swa")])
    before = c.snapshot()
    with pytest.raises(ValueError, match="branch_len=16 must be 0 or past prev_prefix_len=16"):
        c.insert(key, torch.cat([m.device_indices, idx]), prev_prefix_len=16, branch_len=16,
                 swa_indices=swa)
    assert c.snapshot() == before


def test_a_branching_point_without_mamba_is_refused_for_a_state():
    c, d = cache_for(("full", "swa"))
    d.insert(conv(0))
    key = conv(1)
    with pytest.raises(ValueError, match="mamba_branch_slot given but the 'mamba' component"):
        c.insert(key, c.alloc(len(key)), swa_indices=c.alloc(len(key), component="swa"),
                 branch_len=12, mamba_branch_slot=torch.tensor([0]))


@pytest.mark.parametrize("components", COMBOS, ids=COMBO_IDS)
def test_branching_points_are_on_the_match_and_insert_records(components):
    """The match op records the point it reported and the insert op the point it was given and
    the node ending there (span attributes ``kv_cache.match.branch_tokens``,
    ``kv_cache.insert.branch_tokens`` / ``.branch_node.id``): 0 / None where there is none."""
    rec = FlightRecorder()
    c = HiRadixCache(make_config(components, device_tokens=128, host_tokens=0,
                                 sliding_window=4, mamba_slots=16), recorder=rec)
    d = Driver(c)
    d.insert(conv(0), req_id="a", branching=True)
    res = d.insert(conv(1), req_id="b", branching=True)
    ops, _ = rec.tail()
    match_b = [o.attrs for o in ops if o.op == ev.OP_MATCH and o.req_id == "b"][0]
    ins = {o.req_id: o.attrs for o in ops if o.op == ev.OP_INSERT}
    point = len(PROMPT) if len(components) > 1 else 0
    assert match_b[ev.A_BRANCH] == (point or None)  # None: no branching point
    assert (ins["b"][ev.A_BRANCH], ins["b"][ev.A_BRANCH_NODE]) == (point or None,
                                                                res.branch_node)
    assert (res.branch_node is None) == (point == 0)
    assert (ins["a"][ev.A_BRANCH], ins["a"][ev.A_BRANCH_NODE]) == (None, None)
    spans = span_attributes(named_op(next(o for o in rec.ops if o[1] == ev.OP_INSERT
                                          and o[4] == "b")))
    assert spans.get("kv_cache.insert.branch_tokens") == (point or None)  # none: left out
    assert spans.get("kv_cache.insert.branch_node.id") == res.branch_node
