"""Stories of requests through the engine, with exact numbers: reuse from device, load-back
from host, refusals that carry their reason and numbers, a rejection, and retraction."""

from __future__ import annotations

import pytest
import torch

from radixscope.cache import CacheConfig, HiRadixCache
from radixscope.cache.events import attrs_dict
from radixscope.cache.tiers import Tier
from radixscope.engine.admit import Admitter
from radixscope.engine.engine import Engine, EngineConfig
from radixscope.engine.instrument import CountingRecorder, TimedCache
from radixscope.engine.lifecycle import Driver
from radixscope.engine.model import ContentMismatch
from radixscope.engine.request import RequestSpec
from radixscope.engine.workloads.base import Tokens


def make_engine(reqs, preset="full", chunk=16, budget=32, running=2, **sizes):
    sizes = {"device_tokens": 64, "host_tokens": 128, **sizes}
    cfg = CacheConfig.preset(preset, **sizes)
    counter = CountingRecorder()
    cache = TimedCache(HiRadixCache(cfg, recorder=counter), counter)
    return Engine(cache, reqs, EngineConfig(chunk_tokens=chunk, prefill_budget=budget,
                                            max_running=running, check_invariants=True))


def test_reuse_from_device_then_load_back_from_host():
    tok = Tokens(7)
    a, d = tok.ids(44), tok.ids(62)
    reqs = [RequestSpec("A", a, 40), RequestSpec("B", a[:32] + tok.ids(12), 40, after="A"),
            RequestSpec("D", d, 60, after="B"), RequestSpec("E", a + tok.ids(8), 48, after="D")]
    e = make_engine(reqs)
    e.run()
    got = [(s.rid, s.device_hit, s.host_hit, s.chunks, s.admitted_step) for s in e.done]
    # B reuses A's first 32 tokens on device; D (62 tokens) pushes A and B to host (they were
    # written through), so E loads A's whole 44-token sequence back from host.
    assert got == [("A", 0, 0, 3, 1), ("B", 32, 0, 1, 8), ("D", 0, 0, 4, 13),
                   ("E", 0, 44, 1, 19)]
    c = e.cache.counter
    assert dict(c.transfers) == {"backup": 13, "load_back": 1}
    assert dict(c.moved) == {("backup", "full"): 126, ("load_back", "full"): 44}
    assert dict(c.evicted) == {("full", "device"): 118}
    assert e.admitter.verified == 2 and e.admitter.verified_tokens == 76
    assert e.step_no == 23


def test_refusals_carry_reason_and_numbers_and_never_fits_is_rejected():
    tok = Tokens(3)
    reqs = [RequestSpec("A", tok.ids(60), 56), RequestSpec("B", tok.ids(24), 20),
            RequestSpec("C", tok.ids(70), 60, arrival=1)]
    e = make_engine(reqs, chunk=64, budget=64)
    e.run()
    by = {s.rid: s for s in e.done + e.rejected}
    assert [s.rid for s in e.done] == ["A", "B"] and [s.rid for s in e.rejected] == ["C"]
    b = by["B"]
    # step 1: A takes 56 of the 64 slots (and of the step's prefill budget); B's 8-token first
    # chunk would fit, but nothing would be left for A's 4 output tokens and B's other 16.
    assert b.first_reason == (
        "refused (decode reservation): full: 0 tokens left after its load-back and first chunk, "
        "but running requests still need 4 and it needs 16 more for the rest of its prompt and "
        "output")
    # later steps: the cache's own budget says no while A holds its slots
    assert b.last_reason == (
        "refused: full: needs 20 tokens (load-back 0 + prefill 20); can free 5 = free 5 + "
        "evictable 0 - pinned by its own path 0 (protected by others: 56) -> does NOT fit")
    assert (b.refusals, b.attempts, b.admitted_step) == (5, 6, 6)
    assert by["C"].first_reason == ("rejected: full needs 70 device tokens for its 70 prompt + "
                                    "output tokens but the pool holds 64")
    assert e.admitter.refusals == 5


def test_swa_window_is_freed_and_released_during_decode():
    tok = Tokens(11)
    p = tok.ids(40)
    reqs = [RequestSpec("A", p + tok.ids(8), 40),
            RequestSpec("B", p + tok.ids(100), 40, after="A")]
    e = make_engine(reqs, preset="swa", chunk=32, budget=32, running=1, device_tokens=256,
                    host_tokens=256, swa_device_tokens=128, swa_host_tokens=128)
    seen = []

    def watch(engine):
        for s in engine.running:
            seen.append((s.rid, s.seq_len, s.swa_evicted_len,
                         bool(s.receipt is not None and s.receipt.swa_released)))
    e.on_step = watch
    e.run()
    b = [x for x in seen if x[0] == "B"]
    assert b[0][:3] == ("B", 40, 0)  # all 40 prompt tokens reused from A: nothing to prefill
    assert b[-1][:3] == ("B", 139, 75)  # 139 - window 64: SWA slots below 75 were freed
    first_release = next(x for x in b if x[3])
    assert first_release[1] == 103  # 103 - 64 + 1 >= 40: the tree's window is not needed
    ops = e.cache.counter.op_ns
    assert len(ops["release_swa"]) == 1 and len(ops["free"]) > 0


def test_verification_catches_corrupted_host_data():
    tok = Tokens(5)
    a = tok.ids(40)
    reqs = [RequestSpec("A", a, 36), RequestSpec("D", tok.ids(60), 58, after="A"),
            RequestSpec("E", a + tok.ids(4), 42, after="D")]
    e = make_engine(reqs)

    def corrupt(engine):  # once A's data lives on host only, damage one host slot
        for n in engine.cache.tree.nodes.values():
            hv = n.data[0].values[Tier.HOST]
            if n.parent is not None and n.data[0].values[Tier.DEVICE] is None and hv is not None:
                engine.cache.host_pools[0].buf[:, :, hv[0]] += 1.0
                engine.on_step = None
                return
    e.on_step = corrupt
    with pytest.raises(ContentMismatch) as err:
        e.run()
    assert err.value.req_id == "E" and err.value.component == "full"
    assert str(err.value).startswith("content mismatch in request E: full KV at token position ")


def test_retraction_requeues_and_keeps_progress():
    tok = Tokens(9)
    reqs = [RequestSpec("A", tok.ids(30), 28), RequestSpec("B", tok.ids(30), 28)]
    e = make_engine(reqs, chunk=16, budget=32, device_tokens=64)
    e.step()
    assert [s.rid for s in e.running] == ["A", "B"]
    b = e.running[1]
    e.running.remove(b)
    e.driver.retract(b)
    assert (b.phase, b.seq_len, b.retractions) == ("queued", 0, 1)
    e.waiting.appendleft(b)
    e.run()
    assert sorted(s.rid for s in e.done) == ["A", "B"]
    assert e.done[-1].rid == "B" and e.done[-1].device_hit == 16  # its first chunk was cached


def test_driver_never_fits_for_swa():
    cfg = CacheConfig.preset("swa", device_tokens=64, host_tokens=64, swa_device_tokens=64,
                             swa_host_tokens=64)
    d = Admitter(Driver(TimedCache(HiRadixCache(cfg)), None, chunk_tokens=32))
    from radixscope.engine.request import Sequence
    seq = Sequence(RequestSpec("S", tuple(range(10)), 5), torch.zeros((10, 2), dtype=torch.long))
    assert d.never_fits(seq) == ("rejected: swa needs 98 device tokens (window 64 + chunk 32 + "
                                 "2 pages) but the pool holds 64")


class _AllocLog(CountingRecorder):
    """Counts and keeps ``(step, req_id, component, tokens)`` of every alloc that succeeded
    and ``(step, req_id, error)`` of those that raised."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = None
        self.allocs: list[tuple] = []
        self.failed: list[tuple] = []

    def record(self, op, mutations) -> None:
        if op[1] == "alloc" and op[9]:
            self.failed.append((self.engine.step_no, op[4], op[9].split(":")[0]))
        elif op[1] == "alloc":
            attrs = attrs_dict(op[1], op[8])
            self.allocs.append((self.engine.step_no, op[4], attrs["component"], attrs["tokens"]))
        super().record(op, mutations)


def _logged_engine(reqs, preset, running, **sizes):
    cfg = CacheConfig.preset(preset, **sizes)
    log = _AllocLog()
    e = Engine(TimedCache(HiRadixCache(cfg, recorder=log), log), reqs,
               EngineConfig(chunk_tokens=16, prefill_budget=64, max_running=running,
                            check_invariants=True))
    log.engine = e
    return e, log


@pytest.mark.parametrize("preset,page", [("full", 1), ("swa", 1), ("full", 4), ("swa", 4)])
def test_a_decode_step_allocates_once_per_kv_component(preset, page):
    """A batched scheduler's decode allocation: one alloc per KV component for every request
    that needs a slot this step (no req_id), the slots handed out as whole pages; a lone
    request's alloc keeps its req_id. The KV written through them verifies (check_invariants
    and the model's content checks run every step)."""
    tok = Tokens(5)
    reqs = [RequestSpec(r, tok.ids(12), 6) for r in "ABC"]
    sizes = dict(device_tokens=256, host_tokens=256, page_size=page)
    if preset == "swa":
        sizes.update(swa_device_tokens=256, swa_host_tokens=256, sliding_window=8)
    e, log = _logged_engine(reqs, preset, running=3, **sizes)
    e.run()
    assert sorted(s.rid for s in e.done) == ["A", "B", "C"]
    kv = ("full", "swa") if preset == "swa" else ("full",)
    decode = [a for a in log.allocs if a[0] > 1]  # step 1: the three first (only) chunks
    assert decode and all(a[2] in kv for a in decode)
    assert e.cache.config.page_size == page
    for step in sorted({a[0] for a in decode}):
        at = [a for a in decode if a[0] == step]
        assert sorted(a[2] for a in at) == sorted(set(a[2] for a in at))  # one per component
        for _step, req, _comp, tokens in at:
            assert tokens % page == 0 and (req is None) == (tokens > page)
    assert any(a[1] is None for a in decode)  # three requests shared a step's alloc
    assert not log.failed


def test_a_decode_batch_that_does_not_fit_falls_back_to_per_request_allocs():
    """When one call for the whole batch cannot be served, each request allocates its own:
    the ones that fit progress, the others stall (as the per-request path always did)."""
    tok = Tokens(8)
    reqs = [RequestSpec(r, tok.ids(36), 16) for r in "AB"]  # 16 prompt + 20 output tokens
    e, log = _logged_engine(reqs, "full", running=2, device_tokens=80, host_tokens=128)
    e.step()  # both prefilled: each needs a slot per decode step from now on
    assert [s.phase for s in e.running] == ["decode", "decode"]
    held = e.cache.alloc(e.cache.available("full") - 1, component="full")  # one slot left
    before = len(log.allocs)
    e.step()
    new = log.allocs[before:]
    # the batch of 2 did not fit (not tried); A got the last slot on its own, B's own alloc
    # raised and B stalled
    assert log.failed == [(2, "B", "CacheOutOfMemory")]
    assert [(a[1], a[3]) for a in new] == [("A", 1)]
    a, b = e.running
    assert (a.seq_len, b.seq_len) == (17, 16)
    e.cache.free(held, component="full")
    e.run()
    assert sorted(s.rid for s in e.done) == ["A", "B"]
