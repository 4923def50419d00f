"""Will a config's pools fit? Checked before anything is allocated.

``CacheConfig.bytes_needed()`` says what each pool's buffer takes; ``check_fits(config)`` adds
the allocators' bookkeeping, groups the pools by where they live (host pools are always CPU
memory, pinned under CUDA) and compares each group with what that device has available now: RAM
from ``/proc/meminfo`` (``MemAvailable``, capped by a cgroup v2 limit when one is set), CUDA from
``torch.cuda.mem_get_info``. A config that does not fit raises ``NotEnoughMemory`` (a
``ValueError``) that names the numbers, instead of a ``MemoryError`` or an OOM kill halfway
through building the pools.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from radixscope.cache.components import STATE, WINDOW
from radixscope.cache.config import CacheConfig

# a free-page list entry (a pointer plus an int object) and a bitmap byte per page
BOOKKEEPING_BYTES_PER_PAGE = 40


class NotEnoughMemory(ValueError):
    """The pools a config asks for do not fit in the memory available on their device."""


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_ram() -> int | None:
    """Bytes of RAM a new allocation can get now, or None when this platform cannot say."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        avail = None
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limit = _read_int("/sys/fs/cgroup/memory.max")  # "max" (no limit) reads as None
    used = _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        avail = min(avail, max(0, limit - used))
    return avail


def available_bytes(device: str) -> int | None:
    """Free bytes on ``device`` ('cpu', 'cuda', 'cuda:N'), or None when unknown."""
    if device == "cpu":
        return available_ram()
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def _pages(config: CacheConfig) -> int:
    """Pages over all pools (each has a free-list entry and a bitmap byte)."""
    c, p = config, config.page_size
    n = (c.device_tokens + c.host_tokens) // p
    if WINDOW in c.components:
        n += (c.swa_device_tokens + c.swa_host_tokens) // p
    if STATE in c.components:
        n += c.mamba_slots + c.mamba_host_slots
    return n


def needed_by_device(config: CacheConfig) -> dict[str, dict[str, int]]:
    """Per device, per pool: the bytes the pool's buffer takes (bookkeeping under ``cpu``)."""
    out: dict[str, dict[str, int]] = {}
    for pool, nbytes in config.bytes_needed().items():
        out.setdefault(config.pool_device(pool), {})[pool] = nbytes
    out.setdefault("cpu", {})["allocator bookkeeping"] = _pages(config) * BOOKKEEPING_BYTES_PER_PAGE
    return out


def check_fits(config: CacheConfig, available=available_bytes) -> None:
    """Raise ``NotEnoughMemory`` naming the numbers when the pools would not fit.

    Args:
        config: the validated config.
        available: ``device -> free bytes or None`` (tests pass their own).
    """
    for device, pools in needed_by_device(config).items():
        need = sum(pools.values())
        have = available(device)
        if have is None or need <= have:
            continue
        parts = ", ".join(f"{k} {gib(v)}" for k, v in pools.items() if v * 100 >= need)
        raise NotEnoughMemory(
            f"the cache's pools need {need:,} bytes ({gib(need)}) of {device} memory ({parts}) "
            f"but only {have:,} bytes ({gib(have)}) are available; lower the pool sizes "
            "(device_tokens, host_tokens, swa_*_tokens, mamba_*slots) or the model shape")
