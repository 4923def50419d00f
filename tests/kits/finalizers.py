"""Test kit: Python code run in the middle of a C call. Before Python 3.12 a finalizer does it,
run by a collection inside whatever allocates next; from 3.12 a collection no longer runs inside
a C call, and an object whose buffer the call asks for does it instead (``BufferRuns``)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

MID_CALL_GC = sys.version_info < (3, 12)
"""Whether a collection, and with it a finalizer, can run inside a C call that allocates. From
Python 3.12 (gh-97922) an allocation only schedules the collection, which runs at the
interpreter's next check between bytecodes: after the C call has returned, unless the call runs
Python code first."""

mid_call_gc = pytest.mark.skipif(
    not MID_CALL_GC,
    reason="needs a collection inside a C call that allocates: from Python 3.12 (gh-97922) the "
           "collector runs only between bytecodes, after the call")

BUFFER_RUNS = sys.version_info >= (3, 12)
"""Whether a Python class's ``__buffer__`` (PEP 688) is called by C code asking for a buffer."""

buffer_runs = pytest.mark.skipif(
    not BUFFER_RUNS, reason="a Python class's __buffer__ (PEP 688) is called from Python 3.12 on")

MID_CALL = [pytest.param("collection", marks=mid_call_gc),
            pytest.param("buffer", marks=buffer_runs)]
"""How a test runs Python code mid-call, one per Python version (``parametrize("trigger",
MID_CALL)``): a finalizer at a collection (``finalizer_runs``) before 3.12, a ``BufferRuns``
from 3.12."""


@contextmanager
def finalizer_runs(action: Callable[[], None]) -> Iterator[None]:
    """``action`` runs at the next collection, which a low threshold makes come soon: before
    Python 3.12, inside the next call that allocates objects the collector tracks (an encoding,
    a decode, a tuple); from 3.12 only after that call (see ``MID_CALL_GC``)."""
    class Cycle:
        def __del__(self) -> None:
            action()

    gc.collect()
    old = gc.get_threshold()
    c = Cycle()
    c.me = c
    del c
    gc.set_threshold(20)
    try:
        yield
    finally:
        gc.set_threshold(*old)


class BufferRuns:
    """A value whose buffer runs ``action``, once, when C code asks for it
    (``PyObject_GetBuffer``: the sink's encoder, marshal's writer), in the middle of that call:
    from Python 3.12 (PEP 688), where a finalizer no longer runs there. Written as the bytes
    ``DATA``, as any buffer is."""

    DATA = b"ran mid-call"

    def __init__(self, action: Callable[[], None]) -> None:
        self.action: Callable[[], None] | None = action

    def __buffer__(self, flags: int) -> memoryview:
        action, self.action = self.action, None
        if action is not None:
            action()
        return memoryview(self.DATA)
