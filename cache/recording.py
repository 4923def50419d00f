"""Recording: one op record per public operation and one mutation per state change, handed to
the recorder the cache was given. The hot path is the cache's ledger (``ledger.py``, C where
built): it builds plain tuples and appends them (an op record is a tuple in ``OpRecord`` field
order; recorders name it when they need to); nothing is recorded when the recorder is disabled
(the default ``NullRecorder``)."""

from __future__ import annotations

import contextvars
import logging
import operator
import time

from opentelemetry import context as otel_context

from radixscope.cache import events as ev
from radixscope.cache.events import NULL_RECORDER, Recorder
from radixscope.cache.ledger import Ledger
from radixscope.cache.op_attrs import OP_ATTRS
from radixscope.cache.tiers import STORAGE, TIER_LABELS, TIERS

log = logging.getLogger("radixscope.cache")
_time_ns = time.time_ns
_COMP_STATE = ev.COMP_STATE
_POOL_AVAILABLE = ev.POOL_AVAILABLE
_stored_numel = operator.methodcaller("numel")  # a StoredPages' slots


def _context_source():
    """Where the caller's OTel context comes from: the API's own ``ContextVar`` when the default
    runtime context is in use (the ledger reads it with one C call per op),
    ``opentelemetry.context.get_current`` otherwise."""
    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    return var if isinstance(var, contextvars.ContextVar) else otel_context.get_current


_CONTEXT = _context_source()


class Recording:
    """Mixin of ``CacheCore``: op records, mutations, the error hook.

    The hot path is the ledger's (``cache/ledger.py``, C where built), ``self._ledger``:
    ``run(op, req_id, fn, *args)`` runs every public operation, ``m(kind, node, comp, tier,
    value)`` records every state change, ``state(node, ci)`` a component's state on a node
    (``comp.state``) and ``pool(ci, tier, available)`` a pool's free count
    (``pool.available``); the ledger also holds the op and state counters this class reads
    (``seq``, ``current_op_id``). Sites call ``self._ledger.m(...)``, not a bound method kept
    on the cache: that is a method load the interpreter cannot specialize (an instance
    attribute), a type lookup down the cache's long MRO on every call."""

    def _init_recording(self, recorder: Recorder | None) -> None:
        self.recorder = recorder or NULL_RECORDER
        self._on = bool(self.recorder.enabled)
        capture = bool(getattr(self.recorder, "capture_context", False))
        self.use_ledger(Ledger(self, self.recorder.record, _CONTEXT if capture else None,
                               OP_ATTRS, self._on))
        self.recorder_errors = 0
        self.error_hook = None  # called with (op, exception) when an operation raises
        self.bundle_writer = None  # set by telemetry.capture.crash.install_crash_bundles

    def use_ledger(self, ledger) -> None:
        """Record through ``ledger`` from now on (its ``comp.state`` tables set here); benches
        swap ledgers on one cache with it, carrying the counters over themselves."""
        # per component, per tier: what measures a value (slot tensors; a StoredPages on STORAGE)
        sizes = tuple(tuple(_stored_numel if t == STORAGE else size for t in TIERS)
                      for size in self._sizes)
        ledger.set_states(_COMP_STATE, tuple(c.name for c in self.comps), sizes)
        ledger.set_pools(_POOL_AVAILABLE, TIER_LABELS)
        self._ledger = ledger

    @property
    def seq(self) -> int:
        """The number of the last state change recorded (0: none yet)."""
        return self._ledger.seq

    @property
    def _depth(self) -> int:
        return self._ledger.depth

    @_depth.setter
    def _depth(self, value: int) -> None:
        self._ledger.depth = value

    @property
    def _op_id(self) -> int:
        return self._ledger.op_id

    def _op_failed(self, op_id: int, op: str, start: int, end: int, req_id, ctx, seq_first: int,
                   error: BaseException) -> None:
        """A recorded op raised (the ledger calls this before the error propagates): its record,
        with the error, then the error hook."""
        self._emit_record((op_id, op, start, end, req_id, ctx, seq_first, self.seq, {},
                           f"{type(error).__name__}: {error}"))
        self._after_error(op, error)

    def _after_error(self, op: str, error: BaseException) -> None:
        # the failing op is on record before the hook (a crash bundle) looks for it
        if self._depth == 0 and self.error_hook is not None:
            self._run_error_hook(op, error)

    def _begin(self):
        """Start a record outside ``_run`` (transfer acks); nested calls share the outer op."""
        ledger = self._ledger
        ledger.depth += 1
        if not self._on or ledger.depth > 1:
            return None
        ledger.op_id += 1
        ledger.cur_op = ledger.op_id
        return (ledger.op_id, _time_ns(), ledger.seq + 1)

    def end_transfer(self, tok, attrs: dict, start_ns: int) -> None:
        """Close a transfer ack: its own ``transfer`` op record when top-level; when nested in
        another op (a synchronous write-back), the mutations stay with that op and the transfer
        gets a record of its own with no mutations, so it still becomes a linked span."""
        self._depth -= 1
        if tok is not None:
            op_id, _start, seq_first = tok
        elif self._on:
            self._ledger.op_id += 1
            op_id, seq_first = self._ledger.op_id, self.seq + 1
        else:
            return
        self._emit_record((op_id, ev.OP_TRANSFER, start_ns, _time_ns(), None, None, seq_first,
                           self.seq, attrs, None), tok is not None)

    def _end_op(self, tok, op: str, req_id, attrs: dict, start_ns: int,
                force: bool = False) -> None:
        """Close a record opened with ``_begin`` outside ``_run`` (the prefetch hand-back in
        ``poll``): emitted when ``force`` or when the op made mutations; nested: nothing (the
        mutations stay with the outer op)."""
        self._depth -= 1
        if tok is None:
            return
        op_id, _start, seq_first = tok
        if force or self.seq >= seq_first:
            self._emit_record((op_id, op, start_ns, _time_ns(), req_id, None, seq_first,
                               self.seq, attrs, None))

    def _emit_record(self, rec: tuple, take_muts: bool = True) -> None:
        muts = self._ledger.take() if take_muts else []
        try:
            self.recorder.record(rec, muts)
        except Exception as e:  # telemetry must never break the cache; counted and logged
            self._recorder_failed(rec[1], e)

    def _recorder_failed(self, op: str, error: BaseException) -> None:
        self.recorder_errors += 1
        log.error("recorder failed on op %s (failure #%d)", op, self.recorder_errors,
                  exc_info=error)

    def _run_error_hook(self, op: str, error: BaseException) -> None:
        hook, self.error_hook = self.error_hook, None  # no recursion if the hook itself fails
        try:
            hook(op, error)
        except Exception:
            log.exception("error hook failed while handling %s in %s", type(error).__name__, op)
        finally:
            self.error_hook = hook

    # ---- what observers (the crash window) read ------------------------------------------
    @property
    def current_op_id(self) -> int:
        """The id of the op running now (or the last one that ran)."""
        return self._ledger.cur_op

    def pending_mutations(self) -> tuple[tuple, ...]:
        """Mutations made by the op running now and not yet handed to the recorder (a failing
        op's, before its record is written); plain tuples in ``Mutation`` order (with direct
        records, decoded: ``bytes`` where the cache gave an ``array``; see ``ledger.py``)."""
        return tuple(self._ledger.muts)
