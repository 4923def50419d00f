"""The prefetch observer telemetry hands the cache: L3 events -> spans, and -> the event stream.

``StorageSetup(observer=tel.prefetch_observer)`` (or ``PrefetchController(...,
observer=...)``) reports ``cache/storage/prefetch_events`` events here, from the scheduler's
thread (start, end) and the prefetch worker / store writer threads (progress, storage calls).
For each one the observer:

- builds OTel spans through a tracer provider: one ``kv_cache.storage_prefetch`` span per
  prefetch, from ``prefetch.start`` to ``prefetch.end`` (reason, asked / found / hit tokens,
  seconds), ``kv_cache.prefetch.progress`` span events, and ``kv_cache.storage_exists|get``
  child spans with the call's real duration; ``kv_cache.storage_set`` spans for store writes.
  The prefetch span is parented on the caller's span at ``prefetch.start`` (the request's span
  when the engine matches inside it), or on a context given by ``bind_request``; it carries
  ``kv_cache.request.id`` like every op span, so the store's request view finds it either way.
- puts the event into the recorder's side queue (``("event", ts, seq, kind, attrs)``), so the
  store keeps it (``events`` table: the doctor's stuck prefetches) and the metric sink counts
  it (hits, prefetched / unfulfilled tokens per reason, bytes and bandwidth), in the writer
  process or inline, like every other output.

Thread-safe (one lock around the open-span table). A failure is logged and counted under
``prefetch_observer`` in the handle's health, never raised into the cache.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.status import Status, StatusCode

import radixscope.telemetry.names as n
from radixscope.cache.storage import prefetch_events as pe
from radixscope.telemetry.record.drops import Health

STAGE = "prefetch_observer"
_CALL_SPANS = {pe.STORAGE_EXISTS: n.SPAN_STORAGE_EXISTS, pe.STORAGE_GET: n.SPAN_STORAGE_GET,
               pe.STORAGE_SET: n.SPAN_STORAGE_SET}
_ATTRS = {pe.A_REASON: n.ATTR_PREFETCH_REASON, pe.A_POLICY: n.ATTR_PREFETCH_POLICY,
          pe.A_HIT_TOKENS: n.ATTR_PREFETCH_FOUND_TOKENS, pe.A_SECONDS: n.ATTR_PREFETCH_SECONDS,
          pe.A_COMPLETED: n.ATTR_PREFETCH_COMPLETED_TOKENS, pe.A_PAGES: n.ATTR_STORAGE_PAGES,
          pe.A_BYTES: n.ATTR_STORAGE_BYTES, pe.A_STATUS: n.ATTR_STORAGE_STATUS,
          pe.A_COMPONENT: n.ATTR_COMPONENT, pe.A_BACKEND: n.ATTR_STORAGE_BACKEND}
# page statuses that are answers, not failures (a miss is storage saying "not here")
OK_STATUSES = frozenset({"ok", "exists", "miss"})
VERSION = "0.1.0"


def span_attrs(kind: str, attrs: dict) -> dict:
    """The span attributes of one event's attrs (``tokens`` is asked on start, handed back on
    end; the events' ``hit_tokens`` is what storage reported present: ``found_tokens``)."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if isinstance(v, (bool, int, float, str)):
            name = _ATTRS.get(k)
            if k == pe.A_TOKENS:
                name = (n.ATTR_PREFETCH_ASKED_TOKENS if kind == pe.PREFETCH_START
                        else n.ATTR_PREFETCH_HIT_TOKENS)
            if name is not None:
                out[name] = v
    return out


class _Open:
    """One prefetch between start and end: its span, and what the end event needs."""

    __slots__ = ("asked", "span")

    def __init__(self, span: Span | None, asked: int) -> None:
        self.span, self.asked = span, asked


class TelemetryPrefetchObserver(pe.PrefetchObserver):
    """A ``PrefetchObserver`` feeding spans and the telemetry stream (module docstring).

    Args:
        recorder: the telemetry recorder (``submit`` / ``current_seq``); None: spans only.
        health: where failures are counted (``prefetch_observer``).
        tracer_provider: the provider of the spans; None: the global one at each span.
        spans: build spans at all (False: only the event stream).
        max_open: prefetches tracked at once; past it the oldest is ended with
            ``kv_cache.prefetch.reason = "untracked"`` (a bound, not a policy).
    """

    enabled = True

    def __init__(self, recorder: Any, health: Health, *,
                 tracer_provider: trace.TracerProvider | None = None, spans: bool = True,
                 max_open: int = 65536) -> None:
        self.recorder = recorder
        self.health = health
        self.tracer_provider = tracer_provider
        self.spans = spans
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[str, _Open] = collections.OrderedDict()
        self._bound: dict[str, Any] = {}
        self._tracer: trace.Tracer | None = None

    # ---- the engine's side -------------------------------------------------------------------
    def bind_request(self, req_id: str, ctx: Any = None) -> None:
        """Parent ``req_id``'s next prefetch span on ``ctx`` (default: the current context),
        for engines that start prefetches outside the request's span. Never raises."""
        with self.health.guard(STAGE, "bind_request"):
            with self._lock:
                self._bound[str(req_id)] = ctx if ctx is not None else otel_context.get_current()
                while len(self._bound) > self.max_open:
                    self._bound.pop(next(iter(self._bound)))

    def pending(self) -> list[str]:
        """Request ids whose prefetch span is open (started, not yet handed back)."""
        with self._lock:
            return list(self._open)

    # ---- the controller's side ---------------------------------------------------------------
    def event(self, ev: tuple) -> None:
        """One ``prefetch_events`` event ``(kind, req_id, time_ns, attrs)``; never raises."""
        with self.health.guard(STAGE, str(ev[0]) if ev else ""):
            kind, req_id, t_ns, attrs = ev
            attrs = dict(attrs)
            if kind == pe.PREFETCH_START:
                self._start(req_id, t_ns, attrs)
            elif kind == pe.PREFETCH_END:
                attrs = self._end(req_id, t_ns, attrs)
            elif kind == pe.PREFETCH_PROGRESS:
                self._progress(req_id, t_ns, attrs)
                return  # progress is span detail only: the stream gets start / calls / end
            elif kind in _CALL_SPANS:
                self._call(kind, req_id, t_ns, attrs)
            self._submit(kind, req_id, t_ns, attrs)

    # ---- internals ---------------------------------------------------------------------------
    def _get_tracer(self) -> trace.Tracer:
        if self._tracer is None:
            tp = self.tracer_provider or trace.get_tracer_provider()
            self._tracer = tp.get_tracer(n.STORAGE_INSTRUMENTATION_SCOPE, VERSION)
        return self._tracer

    def _start(self, req_id: str | None, t_ns: int, attrs: dict) -> None:
        started = attrs.get(pe.A_REASON) == "started"
        asked = int(attrs.get(pe.A_TOKENS) or 0)
        span = None
        if self.spans:
            with self._lock:
                ctx = self._bound.pop(str(req_id), None)
            a = span_attrs(pe.PREFETCH_START, attrs)
            if req_id is not None:
                a[n.ATTR_REQUEST_ID] = str(req_id)
            span = self._get_tracer().start_span(
                n.SPAN_STORAGE_PREFETCH, context=ctx, kind=SpanKind.INTERNAL, attributes=a,
                start_time=t_ns)
            if not started:  # declined: a zero-length span saying why
                span.end(end_time=t_ns)
                span = None
        if started and req_id is not None:
            with self._lock:
                old = self._open.pop(req_id, None)
                self._open[req_id] = _Open(span, asked)
                evicted = (self._open.popitem(last=False)[1]
                           if len(self._open) > self.max_open else None)
            for o in (old, evicted):
                if o is not None and o.span is not None:
                    o.span.set_attribute(n.ATTR_PREFETCH_REASON, "untracked")
                    o.span.end(end_time=t_ns)

    def _end(self, req_id: str | None, t_ns: int, attrs: dict) -> dict:
        with self._lock:
            o = self._open.pop(req_id, None) if req_id is not None else None
        if o is not None:
            attrs["asked_tokens"] = o.asked
            if o.span is not None:
                o.span.set_attributes({**span_attrs(pe.PREFETCH_END, attrs),
                                       n.ATTR_PREFETCH_ASKED_TOKENS: o.asked})
                o.span.end(end_time=t_ns)
        return attrs

    def _progress(self, req_id: str | None, t_ns: int, attrs: dict) -> None:
        with self._lock:
            o = self._open.get(req_id) if req_id is not None else None
        if o is not None and o.span is not None:
            o.span.add_event(n.EVENT_PREFETCH_PROGRESS,
                             span_attrs(pe.PREFETCH_PROGRESS, attrs), timestamp=t_ns)

    def _call(self, kind: str, req_id: str | None, t_ns: int, attrs: dict) -> None:
        if not self.spans:
            return
        with self._lock:
            o = self._open.get(req_id) if req_id is not None else None
        ctx = (trace.set_span_in_context(o.span, otel_context.Context())
               if o is not None and o.span is not None else None)
        secs = attrs.get(pe.A_SECONDS)
        start = t_ns - int(float(secs) * 1e9) if isinstance(secs, (int, float)) else t_ns
        a = span_attrs(kind, attrs)
        if req_id is not None:
            a[n.ATTR_REQUEST_ID] = str(req_id)
        span = self._get_tracer().start_span(_CALL_SPANS[kind], context=ctx,
                                             kind=SpanKind.CLIENT, attributes=a,
                                             start_time=min(start, t_ns))
        status = str(attrs.get(pe.A_STATUS, "ok"))
        if status not in OK_STATUSES:
            span.set_status(Status(StatusCode.ERROR, status))
            span.set_attribute(n.ATTR_ERROR_TYPE, status)
        span.end(end_time=t_ns)

    def _submit(self, kind: str, req_id: str | None, t_ns: int, attrs: dict) -> None:
        rec = self.recorder
        if rec is None:
            return
        if req_id is not None:
            attrs["req_id"] = str(req_id)
        rec.submit(("event", t_ns, rec.current_seq(), kind, attrs))
