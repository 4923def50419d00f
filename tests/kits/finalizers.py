"""Test kit: a finalizer that runs in the middle of whatever allocates next."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def finalizer_runs(action: Callable[[], None]) -> Iterator[None]:
    """``action`` runs at the next collection, which a low threshold makes come soon: inside
    the next call that allocates objects the collector tracks (an encoding, a decode, a tuple)."""
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
