"""Every backend, one contract: bit-for-bit round trips into host buffers, contiguous exists,
fingerprints never crossed, corrupt pages as misses, thread safety, failures as values."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from radixscope.cache.storage import FileBackend, HostPages, PageStatus, StorageBackend
from tests.kits.storagekit import (
    MooncakeCluster,
    RedisServer,
    fingerprint,
    keys_for,
    kv_host,
    page,
    slots,
)

Maker = Callable[[], StorageBackend]


@pytest.fixture(params=["file", "redis", "mooncake"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Maker]:
    """Opens clients of one store (several calls: several clients of the same store)."""
    opened: list[StorageBackend] = []
    if request.param == "file":
        def new() -> StorageBackend:
            return FileBackend(tmp_path / "l3")
    elif request.param == "redis":
        from radixscope.cache.storage import RedisBackend

        server: RedisServer = request.getfixturevalue("redis_server")

        def new() -> StorageBackend:
            return RedisBackend(server.url)
    else:
        from radixscope.cache.storage import MooncakeBackend

        cluster: MooncakeCluster = request.getfixturevalue("mooncake_cluster")
        prefix = f"t{id(request)}:"

        def new() -> StorageBackend:
            return MooncakeBackend(cluster.master, cluster.metadata, prefix=prefix)

    def make() -> StorageBackend:
        b = new()
        opened.append(b)
        return b

    yield make
    if opened:
        opened[0].clear()
    for b in opened:
        b.close()


def delete_settled(b: StorageBackend, keys: list[str]) -> tuple[PageStatus, ...]:
    """Delete, retrying (bounded) while a reader's lease holds a page (Mooncake: BUSY)."""
    for _ in range(50):
        st = b.delete(keys).statuses
        if PageStatus.BUSY not in st:
            return st
        time.sleep(0.02)
    return st


TOKENS = list(range(100, 140))  # 10 pages of 4


def test_round_trip_is_bit_for_bit(make: Maker) -> None:
    src, dst = kv_host(seed=1), kv_host(seed=2)
    keys = keys_for(TOKENS, src)
    b = make()
    put = b.batch_set(keys, src, slots(3, 10))  # host pages 3..12
    assert put.statuses == (PageStatus.OK,) * 10 and put.nbytes == 10 * src.page_nbytes
    again = b.batch_set(keys, src, slots(3, 10))
    assert again.statuses == (PageStatus.EXISTS,) * 10 and again.all_ok
    untouched = page(dst, 15).clone()
    got = b.batch_get(keys, dst, slots(0, 10))
    assert got.statuses == (PageStatus.OK,) * 10 and got.prefix_ok == 10
    for i in range(10):
        assert torch.equal(page(dst, i).view(torch.int16), page(src, 3 + i).view(torch.int16))
    assert torch.equal(page(dst, 15), untouched)
    s = b.stats()
    assert s.pages["set.ok"] == 10 and s.pages["set.exists"] == 10 and s.pages["get.ok"] == 10
    assert s.bytes_read == s.bytes_written == 10 * src.page_nbytes


def test_state_pool_pages_round_trip(make: Maker) -> None:
    buf = torch.randn(8, 4, 16)  # MAMBA-like [slots, *state], one state per page
    src, dst = HostPages(buf, 1, 0), HostPages(torch.zeros(8, 4, 16), 1, 0)
    keys = fingerprint(kv_host(), component="mamba").keys([bytes([i]) * 32 for i in range(3)])
    b = make()
    assert b.batch_set(keys, src, torch.tensor([5, 1, 6])).all_ok
    assert b.batch_get(keys, dst, torch.tensor([0, 1, 2])).all_ok
    assert torch.equal(dst.buf[:3], buf[[5, 1, 6]])


def test_exists_counts_the_contiguous_prefix(make: Maker) -> None:
    src = kv_host()
    keys = keys_for(TOKENS, src)
    b = make()
    assert b.batch_exists(keys).count == 0
    b.batch_set(keys[:4] + keys[5:8], src, torch.cat([slots(0, 4), slots(5, 3)]))
    r = b.batch_exists(keys)
    assert (r.count, r.status) == (4, PageStatus.OK)
    assert b.batch_exists(keys[5:]).count == 3
    assert delete_settled(b, keys[:2]) == (PageStatus.OK, PageStatus.OK)
    assert delete_settled(b, keys[:1]) == (PageStatus.MISS,)
    assert b.batch_exists(keys).count == 0


def test_a_second_client_of_the_store_hits(make: Maker) -> None:
    src, dst = kv_host(seed=3), kv_host(seed=4)
    keys = keys_for(TOKENS, src)
    make().batch_set(keys, src, slots(0, 10))
    other = make()
    assert other.batch_exists(keys).count == 10
    assert other.batch_get(keys, dst, slots(0, 10)).prefix_ok == 10
    assert torch.equal(dst.buf[:, :, :40], src.buf[:, :, :40])


def test_another_fingerprint_is_never_served(make: Maker) -> None:
    src = kv_host(seed=5)
    b = make()
    b.batch_set(keys_for(TOKENS, src), src, slots(0, 10))
    for other in (keys_for(TOKENS, src, model="other-model"),
                  keys_for(TOKENS, src, component="swa"),
                  keys_for(TOKENS, kv_host(dtype=torch.float16))):
        dst = kv_host(seed=6)
        before = dst.buf.clone()
        assert b.batch_exists(other).count == 0
        r = b.batch_get(other, dst, slots(0, 10))
        assert r.statuses == (PageStatus.MISS,) * 10 and r.reasons() == {"miss": 10}
        assert torch.equal(dst.buf, before)


def test_larger_batches_are_chunked(make: Maker) -> None:
    src = kv_host(slots=4 * 300)
    keys = keys_for(list(range(4 * 300)), src)
    b = make()
    assert b.batch_set(keys, src, slots(0, 300)).all_ok
    assert b.batch_exists(keys).count == 300
    assert b.stats().calls["set"] == 1


def test_many_threads(make: Maker) -> None:
    """8 threads set and get overlapping ranges; every page served is the right one. Mooncake
    may answer a page a concurrent writer is still putting as present to one thread (its set is
    EXISTS) and absent to that thread's immediate get: a miss, never wrong data."""
    src = kv_host(slots=4 * 64, seed=7)
    b = make()
    errors: list[str] = []
    misses: list[int] = []

    def worker(t: int) -> None:
        dst = kv_host(slots=4 * 64, seed=100 + t)
        for r in range(3):
            lo = (t * 5 + r * 3) % 48  # overlapping ranges: concurrent SET NX of the same pages
            keys = keys_for(list(range(lo * 4, (lo + 16) * 4)), src)
            if not b.batch_set(keys, src, slots(lo, 16)).all_ok:
                errors.append(f"set {t}/{r}")
            got = b.batch_get(keys, dst, slots(lo, 16))
            for i, st in enumerate(got.statuses):
                if st is PageStatus.OK:
                    if not torch.equal(page(dst, lo + i), page(src, lo + i)):
                        errors.append(f"wrong page {lo + i} in {t}/{r}")
                elif st is PageStatus.MISS:
                    misses.append(lo + i)
                else:
                    errors.append(f"get {t}/{r}: {st}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
    if b.name != "mooncake":
        assert misses == []
    assert b.stats().calls["get"] == 24


def test_bad_input_raises_before_any_io(make: Maker) -> None:
    src = kv_host()
    keys = keys_for(TOKENS, src)
    b = make()
    with pytest.raises(ValueError, match="10 keys but 9 host pages"):
        b.batch_set(keys, src, slots(0, 9))
    with pytest.raises(ValueError, match="whole pages"):
        b.batch_get(keys[:1], src, torch.arange(3))
    with pytest.raises(TypeError):
        b.batch_exists("abc")
    assert b.batch_exists(keys).count == 0
