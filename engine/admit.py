"""Admission: a queued request's way in, as a serving engine drives SGLang's HiCache.

match (copy-on-write MAMBA) -> the cache's admission budget, plus the engine's decode
reservation (what running requests will still allocate) -> load-back of host hits, and wait ->
lock the anchor -> verify the whole reused prefix against the stand-in model -> first chunk.
A refusal keeps the request queued with its reason and numbers; a request that can never fit
is rejected with its reason. If admission passed, the load-back and the first chunk must not
run out of memory: when they do, it is counted (and recorded) as a budget violation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from opentelemetry import trace

from radixscope.cache.components import BACKBONE, STATE, WINDOW
from radixscope.cache.errors import CacheOutOfMemory
from radixscope.cache.keys import ceil_paged
from radixscope.engine.lifecycle import Driver
from radixscope.engine.model import ContentMismatch
from radixscope.engine.paths import window_indices
from radixscope.engine.request import DECODE, PREFILL, Sequence

ADMITTED, REFUSED, REJECTED = "admitted", "refused", "rejected"
_PREFETCHING = ("started", "ongoing")  # an L3 prefetch runs for the request


@dataclass(frozen=True)
class BudgetViolation:
    """Admission passed, then the load-back or the first chunk ran out of memory."""

    req_id: str
    stage: str  # "load_back" or "prefill"
    error: str
    admission: dict
    anchor: int | None = None  # the match's load-back anchor (best_match_node)


class Admitter:
    """Admits queued requests; counts admissions, refusals, verifications, budget violations.

    Args:
        driver: runs the admitted requests (first chunk, retraction on a violation).
        telemetry: the ``radixscope.telemetry.Telemetry`` handle (admission events, violations) or None.
    """

    def __init__(self, driver: Driver, telemetry=None) -> None:
        self.driver = driver
        self.cache = driver.cache
        self.model = driver.model
        self.tel = telemetry
        self.page, self.window = driver.page, driver.window
        self.swa, self.mamba = driver.swa, driver.mamba
        self.chunk_tokens = driver.chunk_tokens
        self.budget_violations: list[BudgetViolation] = []
        self.admitted = 0
        self.refusals = 0
        self.branch_points = 0  # admissions whose match reported a branching point
        self.verified = 0  # reused prefixes checked against the model
        self.verified_tokens = 0
        # with an L3 tier, admission's match reports what a finished prefetch brought
        self._l3 = {"prefetch": True} if getattr(self.cache, "storage", None) else {}
        # called with (BudgetViolation, CacheOutOfMemory) before the violation is recorded in
        # the store; a strict run raises from it to stop at the first broken admission
        # guarantee (and records it itself), a hook that returns leaves it to be recorded here
        self.on_violation = None

    def never_fits(self, seq: Sequence) -> str | None:
        """Why the request can never run on these pools, even alone; None when it can."""
        cfg = self.cache.config
        full = ceil_paged(seq.total_len, self.page)
        if full > cfg.device_tokens:
            return (f"rejected: full needs {full} device tokens for its {seq.total_len} prompt + "
                    f"output tokens but the pool holds {cfg.device_tokens}")
        if self.swa:
            need = ceil_paged(self.window, self.page) + ceil_paged(self.chunk_tokens, self.page) \
                + 2 * self.page
            if need > cfg.swa_device_tokens:
                return (f"rejected: swa needs {need} device tokens (window {self.window} + chunk "
                        f"{self.chunk_tokens} + 2 pages) but the pool holds "
                        f"{cfg.swa_device_tokens}")
        return None

    def _reserve_refusal(self, seq: Sequence, adm, prefix: int, chunk: int,
                         reserved: dict[str, int]) -> tuple[str | None, dict]:
        """The engine's decode reservation on top of the cache's budget: after this request's
        load-back and first chunk, what is left must cover what the running requests (and this
        one) will still allocate, so admitted requests do not starve each other."""
        first = ceil_paged(min(seq.prompt_len - prefix, chunk), self.page)
        mine = {BACKBONE: max(0, ceil_paged(seq.total_len, self.page) - prefix - first)}
        if self.swa:
            mine[WINDOW] = max(0, self.driver.swa_peak(first >= seq.prompt_len - prefix) - first)
        numbers, bad = {}, []
        for comp, own_future in mine.items():
            need = adm.component(comp)
            left = need.headroom - need.need
            want = reserved.get(comp, 0) + own_future
            numbers[comp] = {"left_after_admission": left, "reserved_for_running":
                             reserved.get(comp, 0), "own_future": own_future}
            if want > left:
                bad.append(f"{comp}: {left} tokens left after its load-back and first chunk, but "
                           f"running requests still need {reserved.get(comp, 0)} and it needs "
                           f"{own_future} more for the rest of its prompt and output")
        if bad:
            return "refused (decode reservation): " + "; ".join(bad), {"reservation": numbers}
        return None, {"reservation": numbers}

    def try_admit(self, seq: Sequence, chunk: int, idle: bool,
                  reserved: dict[str, int] | None = None) -> str:
        """Try to start ``seq`` with a first chunk of at most ``chunk`` tokens. ``idle``: nothing
        else runs and no transfer is in flight, so a refusal now would be final. ``reserved``:
        slots per component the running requests will still allocate."""
        c, spec, rid = self.cache, seq.spec, seq.rid
        seq.attempts += 1
        never = self.never_fits(seq)
        if never is not None:
            return self._reject(seq, never, {})
        with trace.use_span(seq.span, end_on_exit=False):
            try:
                m = c.match_prefix(seq.key[:spec.prompt_len], extra_key=spec.extra_key,
                                   cow_mamba=self.mamba, req_id=rid, **self._l3)
            except CacheOutOfMemory as e:  # no MAMBA state slot for the copy-on-write
                reason = f"refused: mamba copy-on-write slot: {e}"
                return self._reject(seq, reason, {}) if idle else self._refuse(seq, reason, {})
            if getattr(m, "prefetch_status", "off") in _PREFETCHING:
                # declined at arrival (rate limit, host room) and started now: the request
                # waits for it like any prefetching request, rather than prefilling the same
                # tokens the prefetch is fetching
                if m.mamba_slot is not None:
                    c.free(m.mamba_slot, component=STATE, req_id=rid)
                return self._refuse(seq, "refused: its L3 prefetch started at admission; it "
                                    "waits for the hand-back", {"prefetch_tokens":
                                                                m.prefetch_tokens})
            prefix = c.node_prefix_len(m.best_match_node) if m.needs_load_back \
                else m.device_prefix_len
            adm = c.admission(m, spec.prompt_len - prefix, chunk)
            reason, numbers = adm.reason, adm.as_dict()
            if adm.fits:
                why, extra = self._reserve_refusal(seq, adm, prefix, chunk, reserved or {})
                numbers.update(extra)
                if why is not None:
                    reason = why
                    numbers["reason"] = why
            if reason.startswith("refused"):
                if m.mamba_slot is not None:
                    c.free(m.mamba_slot, component=STATE, req_id=rid)
                if idle:
                    return self._reject(seq, reason, numbers)
                return self._refuse(seq, reason, numbers)
            self.admitted += 1
            if self.tel is not None:
                self.tel.record_admission(rid, True, attempts=seq.attempts, **numbers)
            try:
                self._load_and_lock(seq, m, adm)
            except CacheOutOfMemory as e:
                self._violation(seq, "load_back", e, adm.as_dict(), m.best_match_node)
                return REFUSED
            self._verify_prefix(seq)
            seq.phase = PREFILL
            try:
                if seq.seq_len < spec.prompt_len:
                    self.driver.prefill_chunk(seq, chunk)
                else:
                    seq.phase = DECODE
            except CacheOutOfMemory as e:
                self._violation(seq, "prefill", e, adm.as_dict(), m.best_match_node)
                self.driver.retract(seq)
                return REFUSED
        return ADMITTED

    def _load_and_lock(self, seq: Sequence, m, adm) -> None:
        c, rid = self.cache, seq.rid
        loaded: dict[str, int] = {}
        if m.needs_load_back:
            cow = self.mamba
            if m.mamba_slot is not None:  # copied from last_device_node, above the anchor
                c.free(m.mamba_slot, component=STATE, req_id=rid)
            lb = c.load_back(m, cow_mamba=cow, req_id=rid)
            self._prefill_still_fits(adm)
            if lb.transfer_id is not None:
                c.poll([lb.transfer_id], wait=True)
            idx, prefix, anchor, slot = lb.device_indices, lb.device_prefix_len, lb.anchor, \
                lb.mamba_slot
            loaded = dict(lb.loaded)
        else:
            idx, prefix, anchor, slot = m.device_indices, m.device_prefix_len, \
                m.last_device_node, m.mamba_slot
        seq.receipt = c.lock(anchor, owner=rid, req_id=rid) if prefix else None
        seq.anchor = anchor
        seq.full = idx
        seq.swa = torch.full((prefix,), -1, dtype=torch.int64)
        seq.seq_len = seq.cached_len = prefix
        seq.swa_evicted_len = 0
        seq.mamba_slot = slot
        seq.branch_len = m.branch_len if m.branch_len > prefix else 0
        self.branch_points += seq.branch_len > 0
        seq.host_hit = loaded.get(BACKBONE, 0)
        seq.storage_hit = min(m.storage_hit_length, seq.host_hit)
        seq.device_hit = prefix - seq.host_hit
        seq.swa_loaded = loaded.get(WINDOW, 0)
        seq.mamba_loaded = loaded.get(STATE, 0)
        seq.mamba_device_hit = int(self.mamba and prefix > 0 and not seq.mamba_loaded)

    def _prefill_still_fits(self, adm) -> None:
        """The admission guarantee, checked right after the load-back (not one chunk later):
        what admission promised the first chunk per KV component must still be free or
        evictable now that the load-back took its slots (its own path is pinned by then).
        Raises ``CacheOutOfMemory`` with the numbers when it is not."""
        c = self.cache
        for need in adm.components:
            if need.unit != "tokens" or not need.prefill:
                continue
            room = c.available(need.component) + c.evictable_slots(need.component)
            if room < need.prefill:
                snap = {p.component: p for p in c.snapshot().pools if p.tier == "device"}
                raise CacheOutOfMemory(need.component, "device", need.prefill,
                                       c.available(need.component),
                                       c.evictable_slots(need.component),
                                       snap[need.component].protected,
                                       "after the load-back, the first chunk admission "
                                       "promised no longer fits")

    def _verify_prefix(self, seq: Sequence) -> None:
        """Every reused position must hold exactly what the model wrote for that prefix."""
        p, rid = seq.cached_len, seq.rid
        if p == 0:
            return
        model, c = self.model, self.cache
        self.verified += 1
        self.verified_tokens += p
        model.verify_kv(c, BACKBONE, seq.full[:p], seq.hashes[:p], 0, rid)
        if self.swa:
            want = min(self.window, p)
            first, idx = window_indices(c, seq.anchor, WINDOW, want)
            if idx.numel() < want:
                raise ContentMismatch(rid, WINDOW, first - 1, -1, "window slot (missing)")
            model.verify_kv(c, WINDOW, idx, seq.hashes[first:p], first, rid)
        if self.mamba:
            if seq.mamba_slot is None:
                raise ContentMismatch(rid, STATE, p - 1, -1, "state (no copy was made)")
            model.verify_state(c, seq.mamba_slot, seq.hashes[p - 1], p - 1, rid)

    def _refuse(self, seq: Sequence, reason: str, numbers: dict) -> str:
        self.refusals += 1
        seq.refusals += 1
        seq.last_reason = reason
        if not seq.first_reason:
            seq.first_reason = reason
            if self.tel is not None:
                self.tel.record_admission(seq.rid, False, **{"reason": reason, **numbers})
        return REFUSED

    def _reject(self, seq: Sequence, reason: str, numbers: dict) -> str:
        seq.first_reason = seq.last_reason = reason
        if self.tel is not None:
            self.tel.record_admission(seq.rid, False, rejected=True,
                                      **{**numbers, "reason": reason})
        return REJECTED

    def _violation(self, seq: Sequence, stage: str, e: CacheOutOfMemory, adm: dict,
                   anchor: int | None = None) -> None:
        v = BudgetViolation(seq.rid, stage, str(e), adm, anchor)
        self.budget_violations.append(v)
        if self.on_violation is not None:  # a strict run's hook raises: the run stops and
            # records the violation once, with its blame and bundle (``engine.run.execute``)
            self.on_violation(v, e)
        if self.tel is not None:
            self.tel.record_violation(
                f"request {seq.rid} passed admission but its {stage} ran out of memory: {e}",
                kind="budget", details={"req_id": seq.rid, "stage": stage, "admission": adm})


__all__ = ["Admitter", "BudgetViolation", "ADMITTED", "REFUSED", "REJECTED"]
