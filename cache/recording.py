"""Recording: one op record per public operation and one mutation per state change, handed to
the recorder the cache was given. The hot path only builds tuples and appends them; nothing
here runs when the recorder is disabled (the default ``NullRecorder``)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context

from cache import events as ev
from cache.events import NULL_RECORDER, OpRecord, Recorder

if TYPE_CHECKING:
    from cache.tree import Node

log = logging.getLogger("radixscope.cache")
TIERS = (ev.TIER_DEVICE, ev.TIER_HOST)


class Recording:
    """Mixin of ``CacheCore``: op records, mutations, the error hook."""

    def _init_recording(self, recorder: Recorder | None) -> None:
        self.recorder = recorder or NULL_RECORDER
        self._on = bool(self.recorder.enabled)
        self._ctx = bool(getattr(self.recorder, "capture_context", False))
        self.seq = 0
        self._op_id = 0
        self._cur_op = 0
        self._muts: list[tuple] = []
        self._depth = 0
        self.recorder_errors = 0
        self.error_hook = None  # called with (op, exception) when an operation raises
        self.bundle_writer = None  # set by telemetry.crash.install_crash_bundles

    def _begin(self):
        """Start an op record (nested internal calls share the outer op)."""
        self._depth += 1
        if not self._on or self._depth > 1:
            return None
        self._op_id += 1
        self._cur_op = self._op_id
        ctx = otel_context.get_current() if self._ctx else None
        return (self._op_id, time.time_ns(), self.seq + 1, ctx)

    def _end(self, tok, op: str, req_id, attrs: dict | None, error: BaseException | None = None
             ) -> None:
        self._depth -= 1
        if tok is not None:
            op_id, start, seq_first, ctx = tok
            muts, self._muts = self._muts, []
            err = None if error is None else f"{type(error).__name__}: {error}"
            self._emit_record(OpRecord(op_id, op, start, time.time_ns(), req_id, ctx, seq_first,
                                       self.seq, attrs or {}, err), muts)
        # the failing op is on record before the hook (a crash bundle) looks for it
        if error is not None and self._depth == 0 and self.error_hook is not None:
            self._run_error_hook(op, error, tok)

    def end_transfer(self, tok, attrs: dict, start_ns: int) -> None:
        """Close a transfer ack: its own ``transfer`` op record when top-level; when nested in
        another op (a synchronous write-back), the mutations stay with that op and the transfer
        gets a record of its own with no mutations, so it still becomes a linked span."""
        self._depth -= 1
        if tok is not None:
            op_id, _start, seq_first, _ctx = tok
            muts, self._muts = self._muts, []
        elif self._on:
            self._op_id += 1
            op_id, seq_first, muts = self._op_id, self.seq + 1, []
        else:
            return
        self._emit_record(OpRecord(op_id, ev.OP_TRANSFER, start_ns, time.time_ns(), None, None,
                                   seq_first, self.seq, attrs, None), muts)

    def _emit_record(self, rec: OpRecord, muts: list[tuple]) -> None:
        try:
            self.recorder.record(rec, muts)
        except Exception:  # telemetry must never break the cache; counted and logged
            self.recorder_errors += 1
            log.exception("recorder failed on op %s (failure #%d)", rec.op, self.recorder_errors)

    def _run_error_hook(self, op: str, error: BaseException, tok) -> None:
        hook, self.error_hook = self.error_hook, None  # no recursion if the hook itself fails
        try:
            hook(op, error)
        except Exception:
            log.exception("error hook failed while handling %s in %s", type(error).__name__, op)
        finally:
            self.error_hook = hook

    def _m(self, kind: str, node, comp, tier, value) -> None:
        if self._on:
            self.seq += 1
            self._muts.append((self.seq, self._cur_op, kind, node, comp, tier, value))

    def _emit_state(self, node: Node, ci: int) -> None:
        if self._on:
            d = node.data[ci]
            comp = self.comps[ci]
            self.seq += 1
            self._muts.append((self.seq, self._cur_op, ev.COMP_STATE, node.id, comp.name, None, (
                None if d.value is None else comp.size(d.value),
                None if d.host_value is None else comp.size(d.host_value),
                d.lock_ref, d.host_ref)))

    def _emit_pool(self, ci: int, tier: int) -> None:
        if self._on:
            self._m(ev.POOL_AVAILABLE, None, self.comps[ci].name, TIERS[tier],
                    self.pool(ci, tier).alloc.available)
