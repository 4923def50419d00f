"""The file backend: torn, short, corrupt and foreign files are misses; atomic writes; the size
cap evicts least recently used pages; key names cannot escape the directory."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from radixscope.cache.storage import FileBackend, PageStatus, open_backend
from radixscope.cache.storage.codec import frame_bytes
from radixscope.cache.storage.file_backend import file_name
from tests.kits.storagekit import keys_for, kv_host, page, slots

TOKENS = list(range(40))  # 10 pages of 4


def stored(tmp_path: Path) -> tuple[FileBackend, list[str]]:
    src = kv_host(seed=1)
    b = FileBackend(tmp_path)
    keys = keys_for(TOKENS, src)
    assert b.batch_set(keys, src, slots(0, 10)).all_ok
    return b, keys


def test_damaged_files_are_misses_and_leave_host_slots_alone(tmp_path: Path) -> None:
    b, keys = stored(tmp_path)
    path = [tmp_path / file_name(k) for k in keys]
    raw = path[1].read_bytes()
    path[1].write_bytes(raw[: len(raw) // 2])                     # torn / short
    flipped = bytearray(path[2].read_bytes())
    flipped[-1] ^= 0x40
    path[2].write_bytes(bytes(flipped))                           # corrupt payload
    path[3].write_bytes(raw + b"extra")                           # too long
    path[4].write_bytes(path[5].read_bytes())                     # another key's page
    path[6].write_bytes(b"")                                      # empty
    dst = kv_host(seed=9)
    before = dst.buf.clone()
    r = b.batch_get(keys, dst, slots(0, 10))
    assert [s.value for s in r.statuses] == ["ok", "corrupt", "corrupt", "corrupt", "mismatch",
                                             "ok", "miss", "ok", "ok", "ok"]
    assert r.prefix_ok == 1
    for p in (1, 2, 3, 4, 6):
        assert torch.equal(page(dst, p), before[:, :, p * 4:(p + 1) * 4])
    # corrupt files are dropped, so existence stops counting them and a rewrite heals
    assert not path[1].exists() and not path[2].exists()
    assert b.stats().pages["get.corrupt"] == 3


def test_writes_are_atomic_and_leave_no_temporaries(tmp_path: Path) -> None:
    b, keys = stored(tmp_path)
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(file_name(k) for k in keys)
    assert all(not n.startswith(".") for n in names)


def test_size_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    src = kv_host(seed=2)
    keys = keys_for(TOKENS, src)
    size = frame_bytes(keys[0], src.page_nbytes)
    b = FileBackend(tmp_path, max_bytes=4 * size)
    assert b.batch_set(keys[:4], src, slots(0, 4)).all_ok
    b.batch_get(keys[:1], kv_host(), slots(0, 1))               # page 0 becomes most recent
    assert b.batch_set(keys[4:6], src, slots(4, 2)).all_ok       # evicts pages 1 and 2
    present = [b.batch_exists([k]).count for k in keys[:6]]
    assert present == [1, 0, 0, 1, 1, 1]
    s = b.stats()
    assert (s.stored_pages, s.stored_bytes, s.evicted_pages) == (4, 4 * size, 2)
    tiny = FileBackend(tmp_path / "tiny", max_bytes=size - 1)
    assert tiny.batch_set(keys[:1], src, slots(0, 1)).statuses == (PageStatus.FULL,)


def test_index_rebuilt_from_the_directory(tmp_path: Path) -> None:
    b, keys = stored(tmp_path)
    again = FileBackend(tmp_path)
    assert again.stats().stored_pages == 10
    assert again.batch_exists(keys).count == 10
    assert again.clear().all_ok and os.listdir(tmp_path) == []


def test_unsafe_keys_become_hex_names(tmp_path: Path) -> None:
    assert file_name("ab12.ff") == "ab12.ff.kv"
    for key in ("../../etc/passwd", "A/B", ".hidden", "x" * 300):
        name = file_name(key)
        assert "/" not in name and not name.startswith(".") and len(name) < 255
    b = FileBackend(tmp_path / "d")
    src = kv_host()
    assert b.batch_set(["../escape"], src, slots(0, 1)).all_ok
    assert not (tmp_path / "escape").exists() and len(os.listdir(tmp_path / "d")) == 1


def test_open_backend_specs(tmp_path: Path) -> None:
    b = open_backend(f"file:{tmp_path}/x?max_bytes=1000")
    assert isinstance(b, FileBackend) and b.max_bytes == 1000


def test_a_header_advertising_more_than_a_page_is_a_miss_without_reading_it(
        tmp_path: Path) -> None:
    """A planted file says its payload is 256 MiB: the page is not served and the host slot
    keeps its bytes (the read is bounded by the caller's page size, not by the header)."""
    from radixscope.cache.storage import codec

    b, keys = stored(tmp_path)
    path = tmp_path / file_name(keys[0])
    raw = keys[0].encode()
    path.write_bytes(codec._HEAD.pack(codec.MAGIC, codec.VERSION, len(raw), 256 << 20, 0)
                     + raw + b"x" * 4096)
    dst = kv_host(seed=9)
    before = dst.buf.clone()
    r = b.batch_get(keys[:1], dst, slots(0, 1))
    assert r.statuses[0] is not PageStatus.OK and r.prefix_ok == 0
    assert torch.equal(page(dst, 0), before[:, :, 0:4])
