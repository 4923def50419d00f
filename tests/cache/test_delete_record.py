"""A deleted node's values leave with its one ``node.delete`` (schema 6): no ``comp.state``
clears them first, on the device tier (eviction) and the host tier (host eviction) alike, for
every component set. Every reader takes the record as the node and its last states going:
the replay rebuilds the live cache, the engine's counters count each value dropped, and the
miss history finds each drop and the tier the node was last held on; a journal written before
(a clear of each value, then the delete) reads the same."""

from __future__ import annotations

import dataclasses
import random

import pytest

from radixscope.cache import HiRadixCache
from radixscope.cache import events as ev
from radixscope.cache.events import FlightRecorder
from radixscope.cache.snapshot import replay
from radixscope.engine.instrument import CountingRecorder
from radixscope.telemetry.analysis.miss.history import KeyHistory
from tests.kits.cachekit import COMBO_IDS, COMBOS, Driver, make_config


class _Both(CountingRecorder):
    """Counts (the engine's tallies) and keeps every record (the flight recorder's rings)."""

    def __init__(self) -> None:
        self.ring = FlightRecorder(capacity=1 << 16)
        super().__init__(self.ring)


def _run(comps, host_tokens: int, seed: int = 1):
    """A cache run through inserts, device evictions and (with a host tier) host evictions;
    returns the cache, its recorder, the keys inserted and the nodes deleted."""
    rec = _Both()
    c = HiRadixCache(make_config(comps, device_tokens=64, host_tokens=host_tokens),
                     recorder=rec)
    d = Driver(c)
    rng = random.Random(seed)
    keys, deleted = [], []
    for _ in range(40):
        toks = [rng.randrange(40) for _ in range(rng.randrange(4, 20))]
        if c.available() < 20:
            deleted += c.evict(20).deleted
        if host_tokens and c.available(tier="host") < 40:
            c.poll(wait=True)
            deleted += c.evict_host(40).deleted
        d.insert(toks)
        keys.append(toks)
        c.poll(wait=True)
    deleted += c.evict(64).deleted
    if host_tokens:
        deleted += c.evict_host(host_tokens).deleted
    return c, rec, keys, deleted


@pytest.mark.parametrize("host_tokens", [0, 96], ids=["device", "device+host"])
@pytest.mark.parametrize("comps", COMBOS, ids=COMBO_IDS)
def test_a_deleted_nodes_values_leave_with_its_one_node_delete(comps, host_tokens):
    c, rec, _keys, deleted = _run(comps, host_tokens)
    assert len(deleted) > 10
    muts = list(rec.ring.mutations)
    gone = {m[3]: m for m in muts if m[2] == ev.NODE_DELETE}
    assert set(deleted) <= set(gone)
    # within the op that deleted it, a node's only record is its node.delete
    for nid, dm in gone.items():
        same_op = [m for m in muts if m[1] == dm[1] and m[3] == nid]
        assert [m[2] for m in same_op] == [ev.NODE_DELETE], (nid, same_op)
    # the replay drops each node's last states with it: it rebuilds the live cache exactly
    assert replay(rec.ring.initial_snapshot, muts) == c.snapshot()
    c.check()


@pytest.mark.parametrize("comps", COMBOS, ids=COMBO_IDS)
def test_the_engines_counters_count_each_value_a_deletion_drops(comps):
    """Every device slot a deletion freed is counted, per component, as the eviction results
    say (the values on the host tier too, where host eviction deleted the node)."""
    rec = _Both()
    c = HiRadixCache(make_config(comps, device_tokens=64, host_tokens=0), recorder=rec)
    d = Driver(c)
    rng = random.Random(3)
    freed: dict[str, int] = {}
    for _ in range(40):
        if c.available() < 20:
            r = c.evict(20)
            for comp, n in r.freed:
                freed[comp] = freed.get(comp, 0) + n
        d.insert([rng.randrange(40) for _ in range(rng.randrange(4, 20))])
    for comp in comps:
        assert rec.evicted[(comp, ev.TIER_DEVICE)] == freed.get(comp, 0), comp
    assert rec.evictions[(comps[0], ev.TIER_DEVICE)] > 10


def _old_style(start, muts: list[tuple]) -> list[tuple]:
    """The same journal as written before schema 6: each value a node still held cleared by
    a ``comp.state`` of its own just before its ``node.delete``, component by component and
    tier by tier, as ``delete`` cleared them (seqs renumbered)."""
    b_states = {(n.node_id, comp): (st.lens, st.refs)
                for n in start.nodes for comp, st in zip(start.components, n.components,
                                                         strict=True)}
    out: list[tuple] = []
    for m in muts:
        if m[2] == ev.NODE_DELETE:
            for comp in start.components:
                lens, refs = b_states.get((m[3], comp), ((None,) * 3, (0,) * 3))
                lens = list(lens)
                for t, n in enumerate(lens):
                    if n is not None:
                        lens[t] = None
                        out.append((0, m[1], ev.COMP_STATE, m[3], comp, None,
                                    (tuple(lens), tuple(refs))))
        elif m[2] == ev.COMP_STATE:
            b_states[(m[3], m[4])] = (tuple(m[6][0]), tuple(m[6][1]))
        out.append(m)
    first = muts[0][0]
    return [(first + i, *m[1:]) for i, m in enumerate(out)]


@pytest.mark.parametrize("seed", [5, 6])
@pytest.mark.parametrize("comps", COMBOS, ids=COMBO_IDS)
def test_a_journal_that_clears_each_value_before_the_delete_reads_the_same(comps, seed):
    """With a host tier: a node deleted holding FULL on device and host (a tombstone ancestor
    in the cascade) was last held on host, as the old journal's last clear says."""
    c, rec, keys, _ = _run(comps, 96, seed=seed)
    start, muts = rec.ring.initial_snapshot, list(rec.ring.mutations)
    old = _old_style(start, muts)
    assert len(old) > len(muts)
    # the same state (its seq is the longer journal's own)
    assert dataclasses.replace(replay(start, old), seq=c.seq) == replay(start, muts) == c.snapshot()

    def counted(ms):
        r = CountingRecorder()
        r.attach({}, start)
        r.record((1, ev.OP_EVICT, 0, 0, None, None, 0, 0, {}, None), ms)
        return dict(r.evictions), dict(r.evicted)

    assert counted(old) == counted(muts)
    assert counted(muts)[0]

    def history(ms, key):
        h = KeyHistory(start, ms, tuple(key), None)
        drops = {k: len(v) for k, v in h.dropped.items()}
        return drops, [(x.node, x.start, x.end, x.tier, x.cause) for x in h.deletions]

    told = 0
    for key in keys:
        now = history(muts, key)
        assert history(old, key) == now
        told += len(now[1])
    assert told > 0  # some key's path lost nodes: the comparison saw deletions
