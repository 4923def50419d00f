"""The ledger: the per-op bookkeeping of recording (issue 17's hot path), in C where built.

A cache's ``Ledger`` holds its op and state counters (``op_id``, ``cur_op``, ``seq``, ``depth``),
the mutations of the op running now, and runs every public operation:

- ``run(op, req_id, fn, *args)`` runs ``fn(*args)``; at the top level, with recording on, it
  numbers the op, takes the caller's OTel context (``context``: a ``ContextVar`` or a callable;
  None: not captured), times it, builds its attributes (``attrs[op](cache, out, args)``) and
  hands ``record(op_record, mutations)`` one ``OpRecord``-ordered tuple and the op's mutations.
  Nested calls, and every call with recording off, run plainly.
- ``m(kind, node, comp, tier, value)`` numbers one state change and keeps it for the op's record.
- ``state(node, ci)`` records one component's state on a node as ``m`` would: the kind, name
  and per-tier size callables given by ``set_states(kind, names, sizes)``, the value
  ``(lens, refs)`` (each tier's value measured, None where there is none; the refs as a tuple).
  It is the cache's most frequent state change (two a request), so it is one call here.
  ``state(node, ci, tier, size)``: the caller has just measured the value it set on ``tier``
  with that tier's size callable (``set_value``), so that one is not measured again (a torch
  call, ~470 instructions, once a request).
- ``pool(ci, tier, available)`` records a pool's new free count as ``m`` would, with the kind
  and tier labels given by ``set_pools(kind, tiers)`` and the component names of
  ``set_states``: one C call at each alloc and free, no Python frame.
- ``take()`` hands over the mutations kept so far (a record made outside ``run``).

What goes wrong is the cache's to report, through three of its methods the ledger calls (it
holds the cache weakly, so a cache is freed with its last reference, buffers and all):
``_op_failed(op_id, op, start_ns, end_ns, req_id, ctx, seq_first, error)`` when a recorded op
raises (before the error propagates), ``_after_error(op, error)`` when an unrecorded one does,
``_recorder_failed(op, error)`` when the context getter, the attributes or the recorder raise
an ``Exception`` (the op runs and its result stands; a ``BaseException`` such as
``KeyboardInterrupt`` propagates). The callbacks run with the error as the exception being
handled, as in an ``except`` block.

``cache/_ledger.c`` is the same in C: an attribute builder whose type offers the C entry of
``cache/_builders.h`` (``native.Fields``) is called through it, with the op's arguments as the
ledger holds them (the same result as the call with their tuple, no tuple made); a recorded
op's bookkeeping costs about half as much (0.28 us against 0.54 timed alone, attribute builder
and recorder included); ``m`` differs little (a call and a tuple either way). The class below runs where the module was not built or
``RADIXSCOPE_NATIVE=0`` is set (``LEDGER`` says which); tests/cache/test_ledger.py holds the
two to one behaviour.

Direct records (the C ledger only). When ``record``'s type carries the C table of
``cache/_direct.h`` (telemetry's native ``Sink``: the cache imports nothing of telemetry), ``m``
and ``state`` make no tuple: each mutation is written into the ledger's own buffer as marshal
writes its 7-tuple, when it is made (so a value is written as it is then: the cache never
changes a value it recorded), and ``run`` hands the sink the record's fields and those bytes in
one C call. Everything else runs as described above, on tuples made from the bytes when needed:

- a value that cannot be written without running Python code (a float, an int past 64 bits,
  a set, a subclass, an object of another type) puts the running op in list mode: the bytes so
  far are decoded into ``muts`` and the op's later mutations appended there as tuples, until
  its record is handed over;
- reading ``muts`` (``pending_mutations()``) does the same, so the list it returns is the op's
  own, as on the list path; setting it replaces the op's mutations;
- ``take()`` returns the buffer decoded (a failing op's mutations, ``_op_failed`` reads them so);
- a record the sink would not append itself (its buffer at its limit, the sink busy mid-record,
  an attribute it cannot encode, a failed parent lookup) is made into its tuples, the bytes
  decoded, and handed to the sink's call as before (or to its ``fallback``);
- a decoded mutation holds ``bytes`` where the list path's tuple held the ``array`` the cache
  gave (a created node's key): marshal writes both alike, so what the recorder ships is the same
  byte for byte (tests/telemetry/test_sink_direct.py holds the two paths to that).

``direct`` (read-write, the C ledger only) is True where the recorder allows it and it was not
set False; False runs the list path throughout (benches compare the two on one cache). A
re-initialised ledger looks its recorder up again and is direct again where it can be.
"""

from __future__ import annotations

import contextvars
import operator
import time
import weakref
from collections.abc import Callable

from radixscope.cache.native import load_built

ABI = 5  # _ledger.c's LEDGER_ABI: a build with another number is stale
_time_ns = time.time_ns


class PyLedger:
    """The ledger in Python (the reference ``_ledger.c`` is held to)."""

    __slots__ = ("seq", "op_id", "cur_op", "depth", "on", "muts", "_cache", "_record", "_ctx",
                 "_attrs", "_states", "_pools", "__weakref__")

    def __init__(self, cache: object, record: Callable, context: object, attrs: dict,
                 on: bool) -> None:
        check_args(record, context, attrs)
        self._cache = weakref.ref(cache)
        self._record = record
        self._ctx = context.get if isinstance(context, contextvars.ContextVar) else context
        self._attrs = attrs
        self.on = bool(on)
        self.seq = self.op_id = self.cur_op = self.depth = 0
        self.muts: list[tuple] = []
        self._states: tuple | None = None
        self._pools: tuple | None = None

    def run(self, op: str, req_id, fn, *args):
        if self.depth or not self.on:
            self.depth += 1
            try:
                out = fn(*args)
            except BaseException as e:
                self.depth -= 1
                self._owner()._after_error(op, e)
                raise
            self.depth -= 1
            return out
        self.depth = 1
        self.op_id = op_id = self.op_id + 1
        self.cur_op = op_id
        try:
            ctx = self._context(op)
        except BaseException:
            self.depth = 0
            raise
        seq_first = self.seq + 1
        start = _time_ns()
        try:
            out = fn(*args)
        except BaseException as e:
            self.depth = 0
            self._owner()._op_failed(op_id, op, start, _time_ns(), req_id, ctx, seq_first, e)
            raise
        self.depth = 0
        end = _time_ns()
        muts, self.muts = self.muts, []
        cache = self._owner()
        try:
            attrs = self._attrs[op](cache, out, args)
        except Exception as e:  # a bad attribute must not cost the op its record (its mutations)
            cache._recorder_failed(op, e)
            attrs = {}
        try:
            self._record((op_id, op, start, end, req_id, ctx, seq_first, self.seq, attrs, None),
                         muts)
        except Exception as e:  # telemetry must never break the cache; counted and logged
            cache._recorder_failed(op, e)
        return out

    def _context(self, op: str):
        """The caller's context; a getter that fails is the recorder's failure (None), not
        the op's."""
        try:
            return None if self._ctx is None else self._ctx()
        except Exception as e:
            self._owner()._recorder_failed(op, e)
            return None

    def m(self, kind: str, node, comp, tier, value) -> None:
        if self.on:
            self.seq = seq = self.seq + 1
            self.muts.append((seq, self.cur_op, kind, node, comp, tier, value))

    def set_states(self, kind: str, names: tuple, sizes: tuple) -> None:
        check_states(kind, names, sizes)
        self._states = (kind, names, sizes)

    def state(self, node, ci: int, *hint) -> None:
        if len(hint) not in (0, 2):
            raise TypeError("state takes (node, ci) or (node, ci, tier, size)")
        if not self.on:
            return
        if self._states is None:
            raise RuntimeError("state: set_states(kind, names, sizes) was not called")
        kind, names, sizes = self._states
        i = _index_below(ci, len(names), "state: component index")
        size = sizes[i]
        at, given = -1, None
        if hint:
            at, given = _index_below(hint[0], len(size), "state: tier"), hint[1]
        nid, d = node.id, node.data[i]
        values = tuple(d.values)
        if len(values) != len(size):
            raise ValueError(f"state: {len(values)} values for {len(size)} tiers")
        lens = tuple([None if v is None else given if t == at and given is not None else f(v)
                      for t, (v, f) in enumerate(zip(values, size, strict=True))])
        self.m(kind, nid, names[i], None, (lens, tuple(d.refs)))

    def set_pools(self, kind: str, tiers: tuple) -> None:
        check_pools(kind, tiers)
        self._pools = (kind, tiers)

    def pool(self, ci: int, tier: int, available) -> None:
        if not self.on:
            return
        if self._pools is None or self._states is None:
            raise RuntimeError("pool: set_pools(kind, tiers) and set_states(kind, names, sizes) "
                               "were not both called")
        (kind, tiers), names = self._pools, self._states[1]
        self.m(kind, None, names[_index_below(ci, len(names), "pool: component index")],
               tiers[_index_below(tier, len(tiers), "pool: tier")], available)

    def take(self) -> list[tuple]:
        muts, self.muts = self.muts, []
        return muts

    def _owner(self):
        cache = self._cache()
        if cache is None:
            raise RuntimeError("the ledger's cache was freed")
        return cache


def check_args(record: object, context: object, attrs: object) -> None:
    """``PyLedger``'s arguments, checked before anything is kept (``ledger_init`` in
    ``_ledger.c`` makes the same checks, with the same messages)."""
    if not callable(record):
        raise TypeError(f"record must be callable, got {record!r}")
    if context is not None and not (isinstance(context, contextvars.ContextVar)
                                    or callable(context)):
        raise TypeError(f"context must be a ContextVar, a callable or None, got {context!r}")
    if not isinstance(attrs, dict):
        raise TypeError(f"attrs must be a dict of op -> attribute builder, got {attrs!r}")


def _index_below(v, n: int, what: str) -> int:
    """``v`` as ``operator.index`` takes it, in ``[0, n)`` (``_ledger.c``'s ``index_below``)."""
    i = operator.index(v)
    if not 0 <= i < n:
        raise IndexError(f"{what} {v!r} out of range")
    return i


def check_pools(kind: object, tiers: object) -> None:
    """``set_pools``' arguments, checked before anything is kept (as ``_ledger.c`` does)."""
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {kind!r}")
    if type(tiers) is not tuple or not all(isinstance(t, str) for t in tiers):
        raise TypeError(f"tiers must be a tuple of str labels, got {tiers!r}")


def check_states(kind: object, names: object, sizes: object) -> None:
    """``set_states``' arguments, checked before anything is kept (as ``_ledger.c`` does)."""
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {kind!r}")
    if type(names) is not tuple or type(sizes) is not tuple or len(names) != len(sizes):
        raise TypeError(f"names and sizes must be tuples of one length, got {names!r} and "
                        f"{sizes!r}")
    for i, (name, per_tier) in enumerate(zip(names, sizes, strict=True)):
        if not (isinstance(name, str) and type(per_tier) is tuple
                and all(callable(f) for f in per_tier)):
            raise TypeError(f"component {i}: a str name and a tuple of size callables, got "
                            f"{name!r} and {per_tier!r}")


_built = load_built("radixscope.cache._ledger", ABI, "_ledger.c", "the Python ledger")
LEDGER = "python" if _built is None else "native"
Ledger: type = PyLedger if _built is None else _built.Ledger
