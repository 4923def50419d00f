"""Recording: one op record per public operation and one mutation per state change, handed to
the recorder the cache was given. The hot path only builds plain tuples and appends them (an op
record is a tuple in ``OpRecord`` field order; recorders name it when they need to); nothing
here runs when the recorder is disabled (the default ``NullRecorder``)."""

from __future__ import annotations

import contextvars
import logging
import time
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context

from radixscope.cache import events as ev
from radixscope.cache.events import NULL_RECORDER, Recorder
from radixscope.cache.op_attrs import OP_ATTRS
from radixscope.cache.tiers import N_TIERS, TIER_LABELS

if TYPE_CHECKING:
    from radixscope.cache.tree import Node

log = logging.getLogger("radixscope.cache")
_time_ns = time.time_ns
_COMP_STATE = ev.COMP_STATE
_POOL_AVAILABLE = ev.POOL_AVAILABLE
assert N_TIERS == 3, "_emit_state unrolls DEVICE, HOST, STORAGE"


def _context_getter():
    """The function that returns the caller's OTel context: the API's own ``ContextVar.get``
    when the default runtime context is in use (one C call per op instead of three Python
    ones), ``opentelemetry.context.get_current`` otherwise."""
    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    return var.get if isinstance(var, contextvars.ContextVar) else otel_context.get_current


_current_context = _context_getter()


class Recording:
    """Mixin of ``CacheCore``: op records, mutations, the error hook."""

    def _init_recording(self, recorder: Recorder | None) -> None:
        self.recorder = recorder or NULL_RECORDER
        self._on = bool(self.recorder.enabled)
        self._ctx = bool(getattr(self.recorder, "capture_context", False))
        self._record = self.recorder.record
        self.seq = 0
        self._op_id = 0
        self._cur_op = 0
        self._muts: list[tuple] = []
        self._depth = 0
        self.recorder_errors = 0
        self.error_hook = None  # called with (op, exception) when an operation raises
        self.bundle_writer = None  # set by telemetry.capture.crash.install_crash_bundles

    def _run(self, op: str, req_id, fn, *args):
        """Run one public operation ``fn(*args)`` and record it (the hot path of every op).

        Nested internal calls (and every call while recording is off) run plainly: an op's
        record covers everything it did, including the public operations it called."""
        if self._depth or not self._on:
            return self._run_unrecorded(op, fn, args)
        self._depth = 1
        self._op_id = op_id = self._op_id + 1
        self._cur_op = op_id
        ctx = _current_context() if self._ctx else None
        seq_first = self.seq + 1
        start = _time_ns()
        try:
            out = fn(*args)
        except BaseException as e:
            self._depth = 0
            self._emit_record((op_id, op, start, _time_ns(), req_id, ctx, seq_first, self.seq,
                               {}, f"{type(e).__name__}: {e}"))
            self._after_error(op, e)
            raise
        self._depth = 0
        end = _time_ns()
        muts, self._muts = self._muts, []
        try:
            attrs = OP_ATTRS[op](self, out, args)
        except Exception:  # a bad attribute must not cost the op its record (its mutations)
            self._recorder_failed(op)
            attrs = {}
        try:
            self._record((op_id, op, start, end, req_id, ctx, seq_first, self.seq, attrs, None),
                         muts)
        except Exception:  # telemetry must never break the cache; counted and logged
            self._recorder_failed(op)
        return out

    def _run_unrecorded(self, op: str, fn, args):
        self._depth += 1
        try:
            out = fn(*args)
        except BaseException as e:
            self._depth -= 1
            self._after_error(op, e)
            raise
        self._depth -= 1
        return out

    def _after_error(self, op: str, error: BaseException) -> None:
        # the failing op is on record before the hook (a crash bundle) looks for it
        if self._depth == 0 and self.error_hook is not None:
            self._run_error_hook(op, error)

    def _begin(self):
        """Start a record outside ``_run`` (transfer acks); nested calls share the outer op."""
        self._depth += 1
        if not self._on or self._depth > 1:
            return None
        self._op_id += 1
        self._cur_op = self._op_id
        return (self._op_id, _time_ns(), self.seq + 1)

    def end_transfer(self, tok, attrs: dict, start_ns: int) -> None:
        """Close a transfer ack: its own ``transfer`` op record when top-level; when nested in
        another op (a synchronous write-back), the mutations stay with that op and the transfer
        gets a record of its own with no mutations, so it still becomes a linked span."""
        self._depth -= 1
        if tok is not None:
            op_id, _start, seq_first = tok
        elif self._on:
            self._op_id += 1
            op_id, seq_first = self._op_id, self.seq + 1
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
        muts: list[tuple] = []
        if take_muts:
            muts, self._muts = self._muts, []
        try:
            self._record(rec, muts)
        except Exception:  # telemetry must never break the cache; counted and logged
            self._recorder_failed(rec[1])

    def _recorder_failed(self, op: str) -> None:
        self.recorder_errors += 1
        log.exception("recorder failed on op %s (failure #%d)", op, self.recorder_errors)

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
        return self._cur_op

    def pending_mutations(self) -> tuple[tuple, ...]:
        """Mutations made by the op running now and not yet handed to the recorder (a failing
        op's, before its record is written); plain tuples in ``Mutation`` order."""
        return tuple(self._muts)

    def _m(self, kind: str, node, comp, tier, value) -> None:
        if self._on:
            self.seq = seq = self.seq + 1
            self._muts.append((seq, self._cur_op, kind, node, comp, tier, value))

    def _emit_state(self, node: Node, ci: int) -> None:
        if self._on:
            d = node.data[ci]
            self.seq = seq = self.seq + 1
            size = self._sizes[ci]
            # the three tiers unrolled (DEVICE, HOST: slot tensors; STORAGE: StoredPages, their
            # own numel): 0.5 us a state instead of 0.65 for a loop
            dv, hv, sv = d.values
            self._muts.append((seq, self._cur_op, _COMP_STATE, node.id, self.comps[ci].name, None,
                               ((None if dv is None else size(dv),
                                 None if hv is None else size(hv),
                                 None if sv is None else sv.numel()), tuple(d.refs))))

    def _emit_pool(self, ci: int, tier: int, available: int) -> None:
        """A pool's new free count (callers check ``self._on``: this runs on every alloc)."""
        self.seq = seq = self.seq + 1
        self._muts.append((seq, self._cur_op, _POOL_AVAILABLE, None, self.comps[ci].name,
                           TIER_LABELS[tier], available))
