"""Every fault of ``FaultyBackend`` comes back as values: counted, never raised, never wrong
data in the host slots; seeded per rank so ranks diverge and runs replay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from radixscope.cache.storage import (
    FaultyBackend,
    FileBackend,
    PageStatus,
    RedisBackend,
    StorageBackend,
)
from tests.kits.storagekit import (
    RedisServer,
    keys_for,
    kv_host,
    page,
    slots,
)

TOKENS = list(range(40))


@pytest.fixture(params=["file", "redis"])
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], StorageBackend]:
    if request.param == "file":
        return lambda: FileBackend(tmp_path / "l3")
    server: RedisServer = request.getfixturevalue("redis_server")
    return lambda: RedisBackend(server.url)


def served_right(r, dst, src, first: int = 0) -> bool:
    return all(torch.equal(page(dst, i), page(src, first + i))
               for i, s in enumerate(r.statuses) if s.ok)


def test_failures_and_timeouts_are_values(inner) -> None:
    src, dst = kv_host(seed=1), kv_host(seed=2)
    keys = keys_for(TOKENS, src)
    f = FaultyBackend(inner(), seed=3, failure_rate=0.3, timeout_rate=0.3, delay=0.002)
    seen: set[PageStatus] = set()
    for _ in range(20):
        s = f.batch_set(keys, src, slots(0, 10))
        g = f.batch_get(keys, dst, slots(0, 10))
        e = f.batch_exists(keys)
        assert served_right(g, dst, src)
        seen |= set(s.statuses) | set(g.statuses) | {e.status}
    assert {PageStatus.ERROR, PageStatus.TIMEOUT, PageStatus.OK} <= seen
    st = f.stats()
    assert st.errors.get("set.InjectedFault", 0) + st.errors.get("get.InjectedFault", 0) > 0
    assert st.errors.get("get.TimeoutError", 0) + st.errors.get("set.TimeoutError", 0) > 0
    assert f.injected["failure"] + f.injected["timeout"] == sum(st.errors.values())


def test_torn_writes_are_misses(inner) -> None:
    src, dst = kv_host(seed=1), kv_host(seed=2)
    before = dst.buf.clone()
    keys = keys_for(TOKENS, src)
    f = FaultyBackend(inner(), seed=5, torn_rate=0.5)
    assert f.batch_set(keys, src, slots(0, 10)).all_ok  # the writer cannot tell
    g = f.batch_get(keys, dst, slots(0, 10))
    torn = [i for i, s in enumerate(g.statuses) if s is PageStatus.CORRUPT]
    assert len(torn) == f.injected["torn"] > 0
    assert served_right(g, dst, src)
    for i in torn:
        assert torch.equal(page(dst, i), before[:, :, 4 * i:4 * i + 4])
    # dropped on read: a rewrite heals them
    assert FaultyBackend(f.inner).batch_set(keys, src, slots(0, 10)).all_ok
    assert f.inner.batch_get(keys, dst, slots(0, 10)).prefix_ok == 10


def test_stale_exists_says_yes_then_get_misses(inner) -> None:
    src, dst = kv_host(seed=1), kv_host(seed=2)
    keys = keys_for(TOKENS, src)
    f = FaultyBackend(inner(), stale_exists_rate=1.0)
    f.batch_set(keys[:3], src, slots(0, 3))
    assert f.batch_exists(keys).count == 10
    g = f.batch_get(keys, dst, slots(0, 10))
    assert g.prefix_ok == 3 and g.reasons() == {"miss": 7}
    f2 = FaultyBackend(f.inner, get_failure_rate=1.0)
    assert f2.batch_exists(keys[:3]).count == 3
    assert f2.batch_get(keys[:3], dst, slots(0, 3)).prefix_ok == 0


def test_restart_fails_calls_then_works_empty(inner) -> None:
    src, dst = kv_host(seed=1), kv_host(seed=2)
    keys = keys_for(TOKENS, src)
    f = FaultyBackend(inner())
    f.batch_set(keys, src, slots(0, 10))
    f.restart(down_calls=3)
    assert f.batch_exists(keys).status is PageStatus.ERROR
    assert set(f.batch_get(keys, dst, slots(0, 10)).statuses) == {PageStatus.ERROR}
    assert set(f.batch_set(keys, src, slots(0, 10)).statuses) == {PageStatus.ERROR}
    assert f.batch_exists(keys).count == 0  # back, and empty
    assert f.batch_set(keys, src, slots(0, 10)).all_ok
    assert f.injected == {"down": 3}


def test_ranks_diverge_and_seeds_replay(tmp_path: Path) -> None:
    src = kv_host()
    keys = keys_for(TOKENS, src)

    runs = iter(range(100))

    def trace(rank: int, seed: int) -> list[tuple[str, ...]]:
        f = FaultyBackend(FileBackend(tmp_path / str(next(runs))), seed=seed, rank=rank,
                          failure_rate=0.5)
        return [tuple(s.value for s in f.batch_set(keys, src, slots(0, 10)).statuses)
                for _ in range(12)]

    assert trace(0, 1) == trace(0, 1)
    assert trace(0, 1) != trace(1, 1)


def test_bad_rates_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="failure_rate"):
        FaultyBackend(FileBackend(tmp_path), failure_rate=1.5)
