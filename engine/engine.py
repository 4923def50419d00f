"""The continuous-batching loop: arrivals, admission, chunked prefill, decode, finish, poll.

Each step, in this order (SGLang's scheduler order: schedule right after acking transfers):

1. arrivals: requests whose arrival step came (or whose previous turn finished ``delay`` steps
   ago) join the waiting queue, each with its OTel request span;
2. admission from the head of the queue (first come, first served) while the step's prefill
   token budget, the running limit, the cache's admission budget and the engine's decode
   reservation allow; an admitted request runs its first chunk at once; a refused head waits,
   with its reason recorded; a request that could never fit is rejected with its reason;
3. the decoding requests' new slots are allocated in one call per KV component (a batched
   scheduler's decode allocation); then running requests prefill one chunk each (within the
   budget) or decode one token (the stand-in model's writes for the whole decode step are
   applied at once);
4. finished requests are cached (insert), unlocked and released;
5. when no running request could make progress (memory held by the others), the newest is
   retracted (its progress stays cached) and requeued;
6. ``poll()`` acks transfers and, with ``check_invariants``, ``check()`` runs.

With an L3 tier (``HiRadixCache(..., storage=...)``), a request entering the waiting queue
matches with ``prefetch=True`` (an L3 prefetch starts for the tokens past its host match);
admission skips a request whose prefetch is still ongoing (it is handed back by a later
``poll``), and a request that leaves (finished, rejected, aborted) aborts its prefetch.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from radixscope.cache.errors import CacheOutOfMemory
from radixscope.engine import names
from radixscope.engine.admit import ADMITTED, REJECTED, Admitter
from radixscope.engine.lifecycle import DecodeBatch, Driver
from radixscope.engine.model import StandInModel, prefix_hashes
from radixscope.engine.request import DECODE, FINISHED, PREFILL, RequestSpec, Sequence

L3_IDLE_WAIT_S = 0.0005  # a step with nothing to run but prefetches to wait for sleeps this


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler knobs.

    Attributes:
        chunk_tokens: prefill chunk size (tokens per request per step).
        prefill_budget: prefill tokens per step over all requests.
        max_running: requests running at once.
        check_invariants: run ``cache.check()`` after every step.
        check_each_from: from this step on, check after every cache call (locating the op that
            broke an invariant); None = never.
        max_steps: give up (EngineStuck) after this many steps.
    """

    chunk_tokens: int = 256
    prefill_budget: int = 512
    max_running: int = 16
    check_invariants: bool = False
    check_each_from: int | None = None
    max_steps: int = 200_000

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "prefill_budget", "max_running", "max_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an int >= 1")


class EngineStuck(RuntimeError):
    """The loop cannot make progress (a scheduler or cache bug)."""


class Engine:
    """Runs ``requests`` against ``cache`` (a ``TimedCache``) until all finished or rejected.

    Args:
        cache: the engine's cache handle.
        requests: the workload.
        config: scheduler knobs.
        telemetry: the ``radixscope.telemetry.Telemetry`` handle (admission events, violations) or None.
        model_name: ``gen_ai.request.model`` of the request spans.
        on_step: called after every step with the engine (progress bars, fault injection).
    """

    def __init__(self, cache, requests: list[RequestSpec], config: EngineConfig,
                 telemetry=None, model_name: str = "standin",
                 on_step: Callable[[Engine], None] | None = None) -> None:
        ids = [r.rid for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique")
        known = set(ids)
        for r in requests:
            if r.after is not None and r.after not in known:
                raise ValueError(f"request {r.rid} waits for unknown request {r.after!r}")
        self.cache = cache
        self.config = config
        self.model = StandInModel(cache.config)
        self.driver = Driver(cache, self.model, config.chunk_tokens)
        self.admitter = Admitter(self.driver, telemetry)
        self._batch = DecodeBatch()
        self.tel = telemetry
        self.model_name = model_name
        self.on_step = on_step
        self.tracer = trace.get_tracer(names.INSTRUMENTATION_SCOPE)
        self.total = len(requests)
        self.step_no = 0
        self._heap: list[tuple[int, int, RequestSpec]] = []
        self._after: dict[str, list[RequestSpec]] = {}
        for i, r in enumerate(requests):
            if r.after is None:
                self._heap.append((r.arrival, i, r))
            else:
                self._after.setdefault(r.after, []).append(r)
        heapq.heapify(self._heap)
        self._order = {r.rid: i for i, r in enumerate(requests)}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.done: list[Sequence] = []
        self.rejected: list[Sequence] = []
        self.retractions = 0
        self._stuck = 0
        self._l3 = getattr(cache, "storage", None) is not None
        if config.check_each_from is not None and config.check_each_from <= 1:
            cache.check_each = True

    # ---- the loop ----------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return not (self._heap or self.waiting or self.running)

    def run(self) -> None:
        while not self.finished:
            if self.step_no >= self.config.max_steps:
                raise EngineStuck(f"no end after {self.step_no} steps: {len(self.waiting)} "
                                  f"waiting, {len(self.running)} running")
            self.step()

    def step(self) -> None:
        self.step_no += 1
        cfg, c = self.config, self.cache
        self._arrive()
        fresh = len(self.running)
        budget, progressed = self._admit(cfg.prefill_budget)
        batch = self._batch
        self.driver.reserve_decode([s for s in self.running[:fresh]
                                    if s.phase == DECODE and s.seq_len < s.total_len])
        for seq in self.running[:fresh]:
            try:
                if seq.phase == PREFILL and budget > 0:
                    budget -= self.driver.prefill_chunk(seq, budget)
                    progressed = True
                elif seq.phase == DECODE and seq.seq_len < seq.total_len:
                    self.driver.decode_token(seq, batch)
                    progressed = True
            except CacheOutOfMemory:
                continue  # stalled this step; memory comes back as others finish
        self.driver.flush(batch)
        for seq in [s for s in self.running if s.phase == DECODE and s.seq_len >= s.total_len]:
            self.driver.finish(seq)
            self._end(seq, FINISHED)
            progressed = True
        if self.running and not progressed:
            self._unstick()
        else:
            self._stuck = 0
        c.poll()
        if cfg.check_invariants:
            c.check()
        if cfg.check_each_from is not None and self.step_no + 1 >= cfg.check_each_from:
            c.check_each = True  # from the last clean check on: the hook below included
        if self.on_step is not None:
            self.on_step(self)

    def _arrive(self) -> None:
        while self._heap and self._heap[0][0] <= self.step_no:
            _, _, spec = heapq.heappop(self._heap)
            span = self.tracer.start_span(names.span_name(self.model_name), kind=SpanKind.SERVER,
                                          attributes={
                names.GEN_AI_OPERATION_NAME: names.OPERATION,
                names.GEN_AI_PROVIDER_NAME: names.PROVIDER,
                names.GEN_AI_REQUEST_MODEL: self.model_name,
                names.GEN_AI_REQUEST_MAX_TOKENS: spec.output_len,
                names.GEN_AI_USAGE_INPUT_TOKENS: spec.prompt_len,
                names.REQUEST_ID: spec.rid,
                names.REQ_WORKLOAD: spec.kind,
                **({names.REQ_EXTRA_KEY: spec.extra_key} if spec.extra_key else {}),
            })
            hashes = prefix_hashes(spec.tokens, spec.extra_key)
            seq = Sequence(spec, hashes, span=span, arrived_step=self.step_no)
            self.waiting.append(seq)
            if self._l3:  # L3: start fetching what storage holds past the host match
                with trace.use_span(span, end_on_exit=False):
                    m = self.cache.match_prefix(seq.key[:spec.prompt_len], extra_key=spec.extra_key,
                                                req_id=spec.rid, prefetch=True)
                seq.prefetch_status = m.prefetch_status

    def _admit(self, budget: int) -> tuple[int, bool]:
        """Admit from the head of the queue; returns the prefill budget left and whether
        anything changed. Runs first in a step, after the previous step's ``poll``."""
        progressed = False
        while self.waiting and len(self.running) < self.config.max_running and budget > 0:
            seq = self._next_waiting()
            if seq is None:  # every waiting request is still prefetching from L3
                if not self.running:
                    # nothing to run: give the prefetch worker the interpreter instead of
                    # spinning (a spinning step loop starves its file / socket reads)
                    time.sleep(L3_IDLE_WAIT_S)
                break
            idle = not self.running and not self.cache.transfers
            chunk = min(self.config.chunk_tokens, budget)
            reserved: dict[str, int] = {}
            for r in self.running:
                for comp, n in self.driver.future(r).items():
                    reserved[comp] = reserved.get(comp, 0) + n
            out = self.admitter.try_admit(seq, chunk, idle, reserved)
            if out == ADMITTED:
                self.waiting.remove(seq)
                seq.admitted_step = self.step_no
                self.running.append(seq)
                budget -= seq.seq_len - seq.reused  # its first chunk
                progressed = True
            elif out == REJECTED:
                self.waiting.remove(seq)
                self._end(seq, REJECTED)
                progressed = True
            else:
                break
        return budget, progressed

    def _next_waiting(self) -> Sequence | None:
        """The first waiting request whose L3 prefetch is not running (SGLang skips those)."""
        if not self._l3:
            return self.waiting[0]
        state = self.cache.prefetch_state
        for seq in self.waiting:
            st = state(seq.rid)
            if st is None or st.status != "ongoing":
                return seq
        return None

    def _unstick(self) -> None:
        if len(self.running) > 1:
            victim = max(self.running, key=lambda s: (s.admitted_step, self._order[s.rid]))
            self.running.remove(victim)
            self.driver.retract(victim)
            self.retractions += 1
            self.waiting.appendleft(victim)
            return
        self._stuck += 1
        if self._stuck > 3:
            seq = self.running[0]
            raise EngineStuck(f"request {seq.rid} runs alone and cannot allocate for "
                              f"{self._stuck} steps (seq_len {seq.seq_len} of {seq.total_len})")

    def _end(self, seq: Sequence, outcome: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if self._l3:  # the request leaves: release its prefetch (and forget a finished one)
            self.cache.abort_prefetch(seq.rid)
        seq.phase = outcome
        span = seq.span
        attrs = {
            names.REQ_QUEUE_STEPS: max(0, seq.admitted_step - seq.arrived_step),
            names.REQ_ADMISSION_ATTEMPTS: seq.attempts,
            names.REQ_RETRACTIONS: seq.retractions,
        }
        if outcome == FINISHED:
            self.done.append(seq)
            attrs.update({
                names.GEN_AI_USAGE_OUTPUT_TOKENS: seq.spec.output_len,
                names.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: seq.reused,
                names.GEN_AI_RESPONSE_ID: seq.rid,
                names.GEN_AI_RESPONSE_FINISH_REASONS: (names.FINISH_LENGTH,),
                names.REQ_PREFILL_CHUNKS: seq.chunks,
                names.REQ_DEVICE_HIT_TOKENS: seq.device_hit,
                names.REQ_HOST_HIT_TOKENS: seq.host_hit,
                names.REQ_STORAGE_HIT_TOKENS: seq.storage_hit,
                names.REQ_SWA_LOADED_TOKENS: seq.swa_loaded,
                names.REQ_MAMBA_LOADED_STATES: seq.mamba_loaded,
            })
        else:
            self.rejected.append(seq)
            attrs[names.ERROR_TYPE] = names.REJECTED
            span.set_status(Status(StatusCode.ERROR, seq.first_reason))
        if seq.first_reason:
            attrs[names.REQ_REFUSAL_REASON] = seq.first_reason
        span.set_attributes(attrs)
        span.end()
        for nxt in self._after.pop(seq.rid, ()):
            heapq.heappush(self._heap, (self.step_no + nxt.delay, self._order[nxt.rid], nxt))

    def abort(self) -> None:
        """End the spans of every unfinished request (after an error)."""
        for seq in [*self.running, *self.waiting]:
            if self._l3:
                self.cache.abort_prefetch(seq.rid)
            if seq.span is not None and seq.span.is_recording():
                seq.span.set_status(Status(StatusCode.ERROR, "engine stopped"))
                seq.span.end()


__all__ = ["Engine", "EngineConfig", "EngineStuck"]
