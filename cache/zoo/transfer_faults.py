"""Zoo faults around transfers and the admission budget: admission forgetting the SWA
load-back pages, a transfer descriptor mutated in place, host slots freed under a transfer,
and a load-back acked before it landed (classes 4, 5, 8, 10).

Each ``install`` puts the historically buggy variant on one cache instance (or its transfer
engine instance); the classes' code is untouched.
"""

from __future__ import annotations

import dataclasses

import torch

from radixscope.cache.eviction import _Acc
from radixscope.cache.tiers import DEVICE, HOST
from radixscope.cache.zoo import Fault


def _install_admission(cache, inj) -> None:
    """Class 4 (seed 002, SGLang PR #27391): the admission budget ignores the SWA pages a
    load-back of host-only SWA windows allocates."""
    orig = cache.admission

    def admission(match, extend_len, chunk_tokens=None):
        right = orig(match, extend_len, chunk_tokens)
        if not getattr(match, "swa_host_hit_length", 0):
            return right
        wrong = orig(dataclasses.replace(match, swa_host_hit_length=0), extend_len, chunk_tokens)
        if wrong.fits and not right.fits:
            inj.fire(f"admission passed without the {match.swa_host_hit_length} SWA load-back "
                     "tokens", (match.best_match_node,))
        return wrong
    cache.admission = admission


def _install_mutated_transfer(cache, inj) -> None:
    """Class 5 (seed 003, SGLang issue #23429 / PR fixing #22940): the backup's descriptor
    shares its host index tensor with the tree nodes (no clone), and the mover resolves those
    indices in place (here: into offsets of a staging buffer, where SGLang moved them to CUDA),
    so the nodes now name other slots and a later free frees the wrong ones."""
    orig = cache._register_transfer

    def _register_transfer(t):
        if t.kind == "backup":
            for cp in t.copies:
                ci = cache.ci[cp.component]
                shared = _alias_host_values(cache, t.node_ids, ci, cp.dst)
                base = int(cp.dst[0]) if cp.dst.numel() else 0
                if shared and base:
                    cp.dst.sub_(base)  # the in-place "move" of a descriptor the tree shares
                    inj.fire(f"transfer {t.transfer_id}'s {cp.component} host indices moved in "
                             f"place by -{base}; nodes {shared} share them", shared)
        return orig(t)
    cache._register_transfer = _register_transfer


def _alias_host_values(cache, node_ids, ci: int, dst: torch.Tensor) -> list[int]:
    """Make each node whose new host value is the next slice of ``dst`` hold a view of it
    (the pre-fix sharing). Returns the node ids now sharing."""
    off, out = 0, []
    for nid in node_ids:
        d = cache.tree.nodes[nid].data[ci]
        hv = d.values[HOST]
        if hv is None or off + hv.numel() > dst.numel():
            continue
        part = dst[off:off + hv.numel()]
        if torch.equal(part, hv):
            d.values[HOST] = part
            out.append(nid)
            off += hv.numel()
    return out


def _install_host_uaf(cache, inj) -> None:
    """Class 8 (SGLang issue #19126): host eviction of an auxiliary component frees host slots
    without looking at host refs (host copies of nodes still on device count as free to take),
    so a transfer still writing (backup) or reading (load-back) them runs on freed slots."""
    orig = cache._evict_host_slots

    def _evict_host_slots(ci, num):
        if ci == 0:
            return orig(ci, num)
        acc = _Acc(cache)
        while acc.freed[ci] < num:
            # host-only copies first, then host copies of nodes still on device (they look
            # redundant), coldest first; no look at host refs
            victim = next(iter(cache.lru[ci][HOST].values()), None) or next(
                (n for n in cache.lru[ci][DEVICE].values() if n.data[ci].values[HOST] is not None),
                None)
            if victim is None:
                break
            if victim.data[ci].refs[HOST]:
                inj.fire(f"{cache.comps[ci].name} host slots of node {victim.id} freed while "
                         f"{victim.data[ci].refs[HOST]} transfer pin(s) hold them", (victim.id,))
            v = victim.data[ci].values[HOST]
            cache.set_value(victim, ci, HOST, None)
            acc.freed[ci] += cache.free_slots(ci, HOST, v)
            acc.tombstoned.append((cache.comps[ci].name, victim.id))
        return acc.result(ci, num)
    cache._evict_host_slots = _evict_host_slots


def _install_unlanded(cache, inj) -> None:
    """Class 10: a load-back is acked before its copy ran (the completion signal comes before
    the data), so the consumer the ack releases reads device slots that have not landed. The
    copy stays queued and lands later, over whatever was read."""
    eng = cache.engine
    orig = eng.collect

    def collect(core, ids, wait):
        order = list(eng.pending) if ids is None else list(ids)
        early = [tid for tid in order if tid in eng.pending and not eng.pending[tid].ran
                 and eng.pending[tid].event is None
                 and eng.pending[tid].transfer.kind == "load_back"
                 and tid in core.transfers]
        done = [(eng.pending[tid].transfer, eng.pending[tid].started, 0, None) for tid in early]
        for tid in early:
            inj.fire(f"load-back {tid} acked before its copy ran",
                     eng.pending[tid].transfer.node_ids)
        for tid in [t for t in list(eng.pending) if t not in core.transfers]:
            eng.run_cpu(core, eng.pending.pop(tid).transfer)  # the late copy lands now
        rest = [t for t in order if t not in early and t in core.transfers]
        return done + orig(core, rest, wait)
    eng.collect = collect


FAULTS = (
    Fault("admission_swa_load_back", 4, "admission forgetting the SWA pages a load-back "
          "allocates", "seed 002 (SGLang PR #27391)",
          "the admission budget is computed with swa_host_hit_length = 0",
          "the admission guarantee: load-back / first chunk out of memory after admission "
          "passed", _install_admission),
    Fault("transfer_mutated", 5, "a transfer descriptor mutated in place corrupting a later "
          "free", "seed 003 (SGLang issue #23429, regression of PR #22940)",
          "a backup's host index tensor is shared with the nodes and rewritten in place",
          "check(): host slot_freed / slot_shared", _install_mutated_transfer),
    Fault("host_use_after_free", 8, "host slots freed while a transfer still reads them",
          "SGLang issue #19126", "auxiliary host eviction ignores host refs",
          "check(): transfer.slot_freed (new)", _install_host_uaf),
    Fault("unlanded_read", 10, "a consumer reading device slots whose load-back has not landed",
          "issue 12 item 1 (correctness)", "a load-back is acked before its copy ran",
          "check(): transfer.orphan_queued; content verification", _install_unlanded),
)
