"""Open a backend from a spec string (what ``radixscope run --storage`` will take).

- ``file:DIR`` or ``file:DIR?max_bytes=N``
- ``redis://HOST:PORT[/DB][?prefix=P&maxmemory=N]``
- ``mooncake://MASTER_HOST:PORT?metadata=http://HOST:PORT/metadata[&segment=N&prefix=P]``
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from radixscope.cache.storage.base import StorageBackend


def _int(q: dict[str, list[str]], name: str) -> int | None:
    if name not in q:
        return None
    try:
        return int(q[name][-1])
    except ValueError:
        raise ValueError(f"storage spec: {name}={q[name][-1]!r} is not an int") from None


def open_backend(spec: str) -> StorageBackend:
    """The backend a spec names. Raises ValueError for an unknown or malformed spec."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"storage spec must be a non-empty str, got {spec!r}")
    if spec.startswith("file:"):
        from radixscope.cache.storage.file_backend import FileBackend

        path, _, query = spec[5:].partition("?")
        if not path:
            raise ValueError(f"storage spec {spec!r}: file: needs a directory")
        return FileBackend(path, max_bytes=_int(parse_qs(query), "max_bytes"))
    u = urlsplit(spec)
    q = parse_qs(u.query)
    if u.scheme == "redis":
        from radixscope.cache.storage.redis_backend import RedisBackend

        url = f"redis://{u.netloc}{u.path}"
        return RedisBackend(url, prefix=q.get("prefix", ["rs:kv:"])[-1],
                            maxmemory=_int(q, "maxmemory"))
    if u.scheme == "mooncake":
        from radixscope.cache.storage.mooncake_backend import MooncakeBackend

        if "metadata" not in q:
            raise ValueError(f"storage spec {spec!r}: mooncake needs ?metadata=URL")
        return MooncakeBackend(u.netloc, q["metadata"][-1],
                               global_segment_size=_int(q, "segment") or 0,
                               prefix=q.get("prefix", ["rs:kv:"])[-1])
    raise ValueError(f"storage spec {spec!r}: expected file:DIR, redis://HOST:PORT or "
                     "mooncake://HOST:PORT?metadata=URL")
