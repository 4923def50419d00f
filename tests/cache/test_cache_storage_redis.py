"""The redis backend on a real redis-server: two processes share it, the memory cap evicts
LRU, a garbage value is a miss, and a server killed mid-run gives failures, then works again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from radixscope.cache.storage import PageStatus, RedisBackend, open_backend
from tests.kits.storagekit import (
    ROOT_DIR,
    RedisServer,
    keys_for,
    kv_host,
    slots,
)

TOKENS = list(range(40))

CHILD = textwrap.dedent("""
    import sys, torch
    from radixscope.cache.storage import RedisBackend
    from tests.kits.storagekit import keys_for, kv_host, slots
    role, url = sys.argv[1], sys.argv[2]
    b = RedisBackend(url)
    src = kv_host(seed=11)
    keys = keys_for(list(range(40)), src)
    if role == "writer":
        r = b.batch_set(keys, src, slots(0, 10))
        print("set", r.ok_count)
    else:
        dst = kv_host(seed=12)
        e = b.batch_exists(keys)
        g = b.batch_get(keys, dst, slots(0, 10))
        same = torch.equal(dst.buf[:, :, :40], src.buf[:, :, :40])
        print("hit", e.count, g.prefix_ok, same)
""")


def run_child(role: str, url: str) -> str:
    out = subprocess.run([sys.executable, "-c", CHILD, role, url], cwd=ROOT_DIR, timeout=120,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_two_processes_share_one_server(redis_server: RedisServer) -> None:
    assert run_child("writer", redis_server.url) == "set 10"
    assert run_child("reader", redis_server.url) == "hit 10 10 True"


def test_memory_cap_evicts_least_recently_used(redis_server: RedisServer) -> None:
    src = kv_host(slots=4 * 256, seed=3)  # 256 pages of 1.5 KiB
    b = RedisBackend(redis_server.url, maxmemory=2 << 20)
    keys = keys_for(list(range(4 * 256)), src)
    for _ in range(8):  # 8 x 256 pages x 1.6 KB ~ 3.3 MB through a 2 MB cap
        assert b.batch_set(keys, src, slots(0, 256)).all_ok
        keys = keys_for(list(range(4 * 256)), src, model=f"m{_}")
    s = b.stats()
    assert s.evicted_pages > 0 and s.stored_bytes <= (2 << 20) + (1 << 20)
    assert b._client.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-lru"


def test_garbage_value_is_a_miss(redis_server: RedisServer) -> None:
    src = kv_host(seed=4)
    b = RedisBackend(redis_server.url)
    keys = keys_for(TOKENS, src)
    b.batch_set(keys, src, slots(0, 10))
    b._client.set(b.prefix + keys[0], b"not a page")
    r = b.batch_get(keys, kv_host(), slots(0, 10))
    assert r.statuses[0] is PageStatus.CORRUPT and r.statuses[1:] == (PageStatus.OK,) * 9
    assert b.batch_exists(keys).count == 0  # the corrupt page was dropped


def test_server_restarted_mid_run(tmp_path: Path, redis_server: RedisServer) -> None:
    src, dst = kv_host(seed=5), kv_host(seed=6)
    b = open_backend(redis_server.url.replace("/0", "") + "?prefix=run:")
    assert isinstance(b, RedisBackend) and b.prefix == "run:"
    keys = keys_for(TOKENS, src)
    assert b.batch_set(keys[:5], src, slots(0, 5)).all_ok
    redis_server.stop()
    down = [b.batch_exists(keys), b.batch_set(keys, src, slots(0, 10)),
            b.batch_get(keys, dst, slots(0, 10)), b.delete(keys[:1]), b.clear()]
    assert down[0].count == 0 and down[0].status is PageStatus.ERROR and down[0].error
    for r in down[1:]:
        assert set(r.statuses) == {PageStatus.ERROR} and r.error
    assert torch.equal(dst.buf, kv_host(seed=6).buf)
    assert sum(b.stats().errors.values()) == 5
    redis_server.start()  # same port, empty (no persistence)
    assert b.batch_exists(keys).count == 0
    assert b.batch_set(keys, src, slots(0, 10)).all_ok
    assert b.batch_get(keys, dst, slots(0, 10)).prefix_ok == 10
    assert torch.equal(dst.buf[:, :, :40], src.buf[:, :, :40])
