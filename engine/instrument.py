"""What the engine measures about the cache, without touching it.

- ``CountingRecorder`` sits between the cache and telemetry's recorder (it forwards every record)
  and tallies per-op latencies (the cache's own op timestamps), evictions per component and tier
  (a device or host value going away), backups and load-backs (transfers started), and under
  CUDA the bytes and side-stream time of the acked ones (their ``copy_ns``).
- ``TimedCache`` is the engine's handle on the cache: it forwards everything and adds up the time
  spent inside cache calls (for the bench's "share of time in the cache"). With ``check_each``
  it runs ``check()`` after every call and names the call that broke an invariant.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from radixscope.cache import events as ev
from radixscope.cache.errors import InvariantViolation
from radixscope.cache.events import OpRecord, Recorder, named_op
from radixscope.cache.tiers import TIER_LABELS

_NONE = (None,) * len(TIER_LABELS)  # a component's lens once its node is deleted


class CountingRecorder(Recorder):
    """A recorder that counts and forwards. ``inner`` is telemetry's recorder or None."""

    enabled = True

    def __init__(self, inner: Recorder | None = None) -> None:
        self.inner = inner if inner is not None and inner.enabled else None
        self.capture_context = bool(getattr(self.inner, "capture_context", False))
        self.op_ns: dict[str, list[int]] = defaultdict(list)
        self.evictions: Counter[tuple[str, str]] = Counter()  # (component, tier) -> values dropped
        self.evicted: Counter[tuple[str, str]] = Counter()  # (component, tier) -> slots dropped
        self.transfers: Counter[str] = Counter()  # kind -> transfers started
        self.moved: Counter[tuple[str, str]] = Counter()  # (kind, component) -> slots
        # CUDA: kind -> bytes and side-stream ns of the acked transfers that were timed
        self.copy_bytes: Counter[str] = Counter()
        self.copy_ns: Counter[str] = Counter()
        self._last_op: tuple | None = None
        self._state: dict[tuple[int, str], tuple[int | None, int | None]] = {}
        self._comps: tuple[str, ...] = ()

    def attach(self, info: dict, snapshot) -> None:
        self._comps = tuple(snapshot.components)
        for n in snapshot.nodes:
            for comp, st in zip(snapshot.components, n.components, strict=True):
                self._state[(n.node_id, comp)] = st.lens
        if self.inner is not None:
            self.inner.attach(info, snapshot)

    @property
    def last_op(self) -> OpRecord | None:
        """The latest op record, named."""
        return None if self._last_op is None else named_op(self._last_op)

    def record(self, op: tuple, mutations: list[tuple]) -> None:
        """Tally one op (a plain tuple in ``OpRecord`` order) and forward it."""
        self.op_ns[op[1]].append(op[3] - op[2])
        self._last_op = op
        if op[1] == ev.OP_TRANSFER and type(op[8]) is dict and ev.A_COPY_NS in op[8]:
            a = op[8]
            kind = a.get(ev.A_TRANSFER_KIND)
            self.copy_bytes[kind] += a.get(ev.A_BYTES) or 0
            self.copy_ns[kind] += a[ev.A_COPY_NS]
        state = self._state
        for m in mutations:
            kind = m[2]
            if kind == ev.COMP_STATE:
                key = (m[3], m[4])
                lens = m[6][0]
                old = state.get(key)
                if old is not None:
                    self._dropped(m[4], old, lens)
                state[key] = lens
            elif kind == ev.TRANSFER_START:
                _tid, tkind, _nodes, amounts = m[6]
                self.transfers[tkind] += 1
                for comp, n in amounts:
                    self.moved[(tkind, comp)] += n
            elif kind == ev.NODE_DELETE:  # the values the node still held go with it
                for comp in self._comps:
                    old = state.pop((m[3], comp), None)
                    if old is not None:
                        self._dropped(comp, old, _NONE)
        if self.inner is not None:
            self.inner.record(op, mutations)

    def _dropped(self, comp: str, old: tuple, new: tuple) -> None:
        """Count each value ``comp`` held in ``old`` and not in ``new``: one eviction a tier."""
        for label, was, now in zip(TIER_LABELS, old, new, strict=True):
            if was is not None and now is None:
                self.evictions[(comp, label)] += 1
                self.evicted[(comp, label)] += was

    def __getattr__(self, name: str):
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


class OpViolation(RuntimeError):
    """``check()`` failed right after one cache call: names the call and the violations."""

    def __init__(self, call: str, req_id: str | None, op: OpRecord | None,
                 violation: InvariantViolation) -> None:
        self.call = call
        self.req_id = req_id
        self.op = op
        self.violation = violation
        name, node, detail = violation.violations[0]
        where = f"op #{op.op_id} {op.op}" if op is not None else f"call {call}"
        at = f"at node {node}" if node is not None else "(pool-wide)"
        more = len(violation.violations) - 1
        super().__init__(f"invariant {name} broken {at}, first seen right after {where} "
                         f"(request {req_id}): {detail}"
                         + (f" (+{more} more violation(s))" if more else ""))


_TIMED = frozenset({"match_prefix", "admission", "load_back", "poll", "lock", "unlock",
                    "release_swa", "alloc", "free", "insert", "evict", "evict_host", "backup",
                    "path_indices", "node_prefix_len"})


class TimedCache:
    """Forwards to ``cache``; times the calls in ``_TIMED``; optionally checks after each."""

    def __init__(self, cache, counter: CountingRecorder | None = None) -> None:
        self.cache = cache
        self.counter = counter
        self.ns = 0
        self.calls = 0
        self.check_each = False

    def __getattr__(self, name: str):
        attr = getattr(self.cache, name)
        if name not in _TIMED:
            return attr

        def call(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return attr(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - t0
                self.calls += 1
                if self.check_each:
                    self._check(name, kwargs.get("req_id"))
        return call

    def _check(self, name: str, req_id: str | None) -> None:
        # violations(), not check(): the run bundles this failure itself, naming the op that
        # broke the rule (check() would bundle it as a failure of ``check``)
        found = self.cache.violations()
        if found:
            op = self.counter.last_op if self.counter is not None else None
            raise OpViolation(name, req_id, op, InvariantViolation(found))


__all__ = ["CountingRecorder", "TimedCache", "OpViolation"]
