"""A fault-injecting wrapper around any backend, for tests (after SGLang's failure injector).

``FaultyBackend(inner, seed=..., rank=...)`` injects, from one RNG seeded by ``(seed, rank)``
(so tensor-parallel ranks diverge, and a run replays):

- ``delay``: a random sleep in ``[0, delay]`` seconds before each call;
- ``failure_rate``: each call fails (raises inside the primitive -> ``ERROR`` statuses);
- ``timeout_rate``: each call times out (``TIMEOUT`` statuses);
- ``torn_rate``: each page written is cut short (a torn write: the store holds a partial page,
  which a read reports as ``CORRUPT``);
- ``stale_exists_rate``: an exists call answers "all present" whatever is stored; a get of a
  page that is not there is then a miss (exists says yes, get fails);
- ``get_failure_rate``: each page read fails although it is stored;
- ``restart(down_calls, lose_data)``: the backend is down for the next ``down_calls`` calls
  (``ERROR``), then back, empty if ``lose_data`` (a restarted server without persistence).

Every fault surfaces as a result value, never an exception; ``injected`` counts them.
"""

from __future__ import annotations

import random
import threading
import time

from radixscope.cache.storage import codec
from radixscope.cache.storage.base import StorageBackend
from radixscope.cache.storage.results import PageStatus


class InjectedFault(ConnectionError):
    """A failure injected by ``FaultyBackend``."""


class FaultyBackend(StorageBackend):
    """Wraps ``inner``'s primitives with seeded faults. See the module docstring."""

    def __init__(self, inner: StorageBackend, *, seed: int = 0, rank: int = 0,
                 delay: float = 0.0, failure_rate: float = 0.0, timeout_rate: float = 0.0,
                 torn_rate: float = 0.0, stale_exists_rate: float = 0.0,
                 get_failure_rate: float = 0.0) -> None:
        super().__init__(inner.max_batch)
        for name, v in (("delay", delay), ("failure_rate", failure_rate),
                        ("timeout_rate", timeout_rate), ("torn_rate", torn_rate),
                        ("stale_exists_rate", stale_exists_rate),
                        ("get_failure_rate", get_failure_rate)):
            if not isinstance(v, (int, float)) or v < 0 or (name != "delay" and v > 1):
                raise ValueError(f"{name}={v!r}: must be a number in [0, 1] (delay: >= 0)")
        self.inner = inner
        self.name = f"faulty({inner.name})"
        self.rank = rank
        self.delay = delay
        self.failure_rate = failure_rate
        self.timeout_rate = timeout_rate
        self.torn_rate = torn_rate
        self.stale_exists_rate = stale_exists_rate
        self.get_failure_rate = get_failure_rate
        self._rng = random.Random(f"{seed}:{rank}")
        self._lock = threading.Lock()
        self._down = 0
        self.injected: dict[str, int] = {}

    def restart(self, down_calls: int = 1, lose_data: bool = True) -> None:
        """Take the backend down for the next ``down_calls`` calls; with ``lose_data`` it comes
        back empty."""
        with self._lock:
            self._down = down_calls
        if lose_data:
            self.inner._clear()

    # ---- fault drawing ----
    def _note(self, what: str) -> None:
        self.injected[what] = self.injected.get(what, 0) + 1

    def _draw(self, rate: float) -> bool:
        return rate > 0 and self._rng.random() < rate

    def _enter(self) -> None:
        """Delay, then maybe fail the whole call."""
        with self._lock:
            pause = self._rng.uniform(0, self.delay) if self.delay else 0.0
            if self._down > 0:
                self._down -= 1
                self._note("down")
                raise InjectedFault("backend restarting (injected)")
            fail = self._draw(self.failure_rate)
            timeout = not fail and self._draw(self.timeout_rate)
            if fail:
                self._note("failure")
            if timeout:
                self._note("timeout")
        if pause:
            time.sleep(pause)
        if fail:
            raise InjectedFault("injected backend failure")
        if timeout:
            raise TimeoutError("injected backend timeout")

    # ---- primitives ----
    def _exists(self, keys: list[str]) -> int:
        self._enter()
        with self._lock:
            stale = self._draw(self.stale_exists_rate)
            if stale:
                self._note("stale_exists")
        return len(keys) if stale else self.inner._exists(keys)

    def _get(self, keys: list[str],
             max_payload: int = codec.MAX_PAGE_BYTES) -> list[bytes | memoryview | None]:
        self._enter()
        blobs = self.inner._get(keys, max_payload)
        with self._lock:
            drop = [self._draw(self.get_failure_rate) for _ in blobs]
            for d in drop:
                if d:
                    self._note("get_failure")
        return [None if d else b for b, d in zip(blobs, drop, strict=False)]

    def _put(self, keys: list[str], blobs: list[bytes]) -> list[PageStatus]:
        self._enter()
        with self._lock:
            cuts = [self._rng.randrange(1, len(b)) if self._draw(self.torn_rate) else -1
                    for b in blobs]
            for c in cuts:
                if c >= 0:
                    self._note("torn")
        torn = [b if c < 0 else b[:c] for b, c in zip(blobs, cuts, strict=False)]
        return self.inner._put(keys, torn)

    def _delete(self, keys: list[str]) -> list[PageStatus]:
        self._enter()
        return self.inner._delete(keys)

    def _discard(self, keys: list[str]) -> None:
        self.inner._discard(keys)

    def _clear(self) -> None:
        self._enter()
        self.inner._clear()

    def _holding(self) -> tuple[int, int, int]:
        return self.inner._holding()

    def _classify(self, exc: BaseException) -> PageStatus:
        return self.inner._classify(exc)

    def close(self) -> None:
        self.inner.close()
