"""The flight recorder's window as a crash bundle stores it: a start state and what followed.

``capture`` reads the recorder (``window()`` when it keeps a keyframe, as
``KeyframedFlightRecorder`` does; else ``tail()`` plus the attach snapshot while the ring has not
wrapped) and makes sure the mutations run without a hole up to the failure:

- a telemetry recorder's drain thread may be between taking a batch and copying it into the
  rings; ``capture`` reads again (for up to ``_WAIT_S``) until the hole closes;
- the cache calls ``error_hook`` *before* it hands the failing op to the recorder, so that op's
  record and mutations are not recorded yet. ``_unrecorded`` reads them from the cache (the only
  place this module looks at cache internals) and the failing op record is rebuilt from the
  traceback. Once the cache records the failing op before calling the hook, both steps find
  nothing to do.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

from radixscope.cache.events import Mutation, OpRecord
from radixscope.cache.snapshot import CacheSnapshot, SnapshotBuilder
from radixscope.telemetry.record.encode import with_token_arrays

_WAIT_S = 0.5
_POLL_S = 0.01


@dataclass(frozen=True)
class Window:
    """What a bundle keeps of the recorder.

    ``start`` is the exact state at ``start.seq`` (None when the recorder cannot give one);
    ``mutations`` are the ones after it, in seq order; ``failing_op`` is the record of the op
    that raised (None on demand). ``gaps`` lists ``(last seq before, first seq after)`` holes.
    """

    start: CacheSnapshot | None
    ops: tuple[OpRecord, ...]
    mutations: tuple[Mutation, ...]
    failing_op: OpRecord | None
    wrapped: bool
    gaps: tuple[tuple[int, int], ...]
    rebuilt_failing_op: bool
    recorder: str | None

    def describe(self, live_seq: int) -> dict:
        """The manifest's ``window`` entry. Without a start state the bundle's one keyframe is
        the live snapshot, so ``keyframe_seq`` is ``live_seq``."""
        first = self.mutations[0].seq if self.mutations else None
        last = self.mutations[-1].seq if self.mutations else None
        return {"recorder": self.recorder, "ops": len(self.ops), "mutations": len(self.mutations),
                "first_seq": first, "last_seq": last, "live_seq": live_seq,
                "keyframe_seq": live_seq if self.start is None else self.start.seq,
                "replayable": self.start is not None and not self.gaps,
                "ring_wrapped": self.wrapped, "gaps": [list(g) for g in self.gaps],
                "first_op_id": self.ops[0].op_id if self.ops else None,
                "last_op_id": self.ops[-1].op_id if self.ops else None,
                "failing_op_rebuilt": self.rebuilt_failing_op}


def capture(cache: Any, recorder: Any, n_ops: int | None, op: str | None,
            exc: BaseException | None, op_id: int | None = None) -> Window:
    """Read the recorder's window up to the cache's current seq (see the module docstring).
    ``op_id``: the failure is blamed on that recorded op (it completed; nothing is rebuilt)."""
    if recorder is None or not getattr(recorder, "enabled", False) or not hasattr(recorder,
                                                                                  "tail"):
        return Window(None, (), (), None, False, (), False, None)
    target = int(getattr(cache, "seq", 0))
    deadline = time.monotonic() + _WAIT_S
    while True:
        start, ops, muts = _read(recorder)
        last = muts[-1].seq if muts else (start.seq if start is not None else 0)
        muts += _unrecorded(cache, last)
        gaps = _gaps(muts)
        reached = (muts[-1].seq if muts else last) >= target
        if (not gaps and reached) or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    wrapped = start is not None and bool(muts) and muts[0].seq > start.seq + 1
    if wrapped:
        start = None
    if start is not None:
        muts = [m for m in muts if m.seq > start.seq]
    if op_id is not None:
        failing, rebuilt = next((o for o in reversed(ops) if o.op_id == op_id), None), False
    else:
        failing, rebuilt = _failing_op(cache, ops, muts, op, exc)
    if rebuilt and failing is not None:
        ops.append(failing)
        cap = getattr(recorder, "capacity", None)
        if isinstance(cap, int) and len(ops) > cap:
            ops = ops[-cap:]  # what the op ring holds once the failing op is recorded
    if n_ops is not None:
        start, ops, muts = _keep_last(start, ops, muts, n_ops)
    return Window(start, tuple(ops), tuple(muts), failing, wrapped, tuple(gaps), rebuilt,
                  type(recorder).__name__)


def _read(recorder: Any) -> tuple[CacheSnapshot | None, list[OpRecord], list[Mutation]]:
    if hasattr(recorder, "window"):
        start, ops, muts = recorder.window()
    else:
        ops, muts = recorder.tail()
        start = getattr(recorder, "initial_snapshot", None)
    return start, list(ops), [m if isinstance(m, Mutation) else Mutation._make(m) for m in muts]


def _unrecorded(cache: Any, last: int) -> list[Mutation]:
    """Mutations the cache made but has not handed to the recorder yet (the failing op's).
    With direct records they were decoded from the ledger's bytes, a created node's tokens as
    ``bytes``: made an array again, as the recorder's decoding does (replayed as they were,
    each byte counted a token)."""
    pending = cache.pending_mutations() if hasattr(cache, "pending_mutations") else ()
    return [Mutation._make(m) for m in with_token_arrays(list(pending)) if m[0] > last]


def _gaps(muts: list[Mutation]) -> list[tuple[int, int]]:
    return [(a.seq, b.seq) for a, b in zip(muts, muts[1:], strict=False) if b.seq != a.seq + 1]


def _failing_op(cache: Any, ops: list[OpRecord], muts: list[Mutation], op: str | None,
                exc: BaseException | None) -> tuple[OpRecord | None, bool]:
    """The failing op's record: the recorder's last one when it is already there, else one
    rebuilt from the cache's op counter (and its request id from the ledger's ``run`` frame in
    the traceback, where the ledger is the Python one)."""
    if exc is None or op is None:
        return None, False
    cur = getattr(cache, "current_op_id", None)
    if ops and ops[-1].error is not None and ops[-1].op == op and (cur is None
                                                                   or ops[-1].op_id == cur):
        return ops[-1], False
    if cur is None or (ops and ops[-1].op_id >= cur):
        return None, False
    mine = [m for m in muts if m.op_id == cur]
    seq_first = mine[0].seq if mine else int(getattr(cache, "seq", 0)) + 1
    now = time.time_ns()
    return OpRecord(cur, op, now, now, _req_id_of(exc), None, seq_first,
                    int(getattr(cache, "seq", 0)), {}, f"{type(exc).__name__}: {exc}"), True


def _req_id_of(exc: BaseException) -> str | None:
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_name == "run" and {"req_id", "fn"} <= frame.f_locals.keys():
            v = frame.f_locals["req_id"]
            return v if isinstance(v, str) else None
    return None


def _keep_last(start: CacheSnapshot | None, ops: list[OpRecord], muts: list[Mutation],
               n_ops: int) -> tuple[CacheSnapshot | None, list[OpRecord], list[Mutation]]:
    """Cut the window to its last ``n_ops`` ops, moving the start state forward to match."""
    ops = ops[-n_ops:] if n_ops else []
    cut = ops[0].seq_first if ops else (muts[-1].seq + 1 if muts else 0)
    older = [m for m in muts if m.seq < cut]
    if start is not None and older:
        start = SnapshotBuilder(start).apply_all(older).snapshot()
    return start, ops, [m for m in muts if m.seq >= cut]
