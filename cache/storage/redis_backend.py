"""``redis``: a shared L3 on a real ``redis-server`` (redis-py, imported lazily).

- Keys are ``{prefix}{key}``; values are pages in ``codec`` form.
- ``_put``: one pipeline of ``SET key value NX`` (a stored page is never overwritten);
  ``_get``: one ``MGET``; ``_exists``: one pipeline of per-key ``EXISTS`` (the contiguous count
  needs per-key answers); ``_delete``: a pipeline of ``DEL``; ``_clear``: ``SCAN MATCH prefix*``
  + ``UNLINK`` (never ``FLUSHDB`` on a shared server).
- Memory cap: pass ``maxmemory`` (bytes) to set ``maxmemory`` and ``maxmemory-policy
  allkeys-lru`` on the server at start (``CONFIG SET``), or configure the server so
  (``--maxmemory 4gb --maxmemory-policy allkeys-lru``). Redis then evicts the least recently
  used pages; an evicted page is a miss. Under ``noeviction`` a full server rejects writes:
  those pages come back ``FULL``.
- Several processes share one server: what one wrote, another reads (SET NX makes concurrent
  writers of the same page harmless).
- Connection loss, timeouts and a restarted server come back as ``ERROR``/``TIMEOUT`` statuses;
  the client reconnects on the next call. Opening does not connect (unless ``maxmemory`` is
  given); ``probe()`` pings once, for a caller that wants a wrong target refused up front.

Thread-safe: redis-py clients share a connection pool; each call uses its own pipeline.
"""

from __future__ import annotations

from typing import Any

from radixscope.cache.storage import codec
from radixscope.cache.storage.base import MAX_BATCH, StorageBackend
from radixscope.cache.storage.results import PageStatus


class RedisBackend(StorageBackend):
    """Pages in Redis.

    Args:
        url: ``redis://HOST:PORT[/DB]``.
        prefix: key namespace in the server (``clear`` removes only these keys).
        maxmemory: if given, set the server's memory cap (bytes) and ``allkeys-lru``.
        socket_timeout: seconds per command before a ``TIMEOUT`` status.
        max_batch: pages per call chunk.
    """

    name = "redis"

    def __init__(self, url: str, prefix: str = "rs:kv:", maxmemory: int | None = None,
                 socket_timeout: float = 5.0, max_batch: int = MAX_BATCH) -> None:
        super().__init__(max_batch)
        import redis  # lazy: an optional dependency of the cache

        self._redis = redis
        self.url = url
        self.prefix = prefix
        self._client: Any = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
            health_check_interval=0, retry_on_timeout=False)
        if maxmemory is not None:
            if not isinstance(maxmemory, int) or maxmemory < 1:
                raise ValueError(f"maxmemory must be an int >= 1, got {maxmemory!r}")
            try:
                self._client.config_set("maxmemory", str(maxmemory))
                self._client.config_set("maxmemory-policy", "allkeys-lru")
            except redis.RedisError as e:
                self.close()
                raise ValueError(f"redis {url}: cannot set maxmemory={maxmemory} ({e})") from None

    def _classify(self, exc: BaseException) -> PageStatus:
        if isinstance(exc, (self._redis.TimeoutError, TimeoutError)):
            return PageStatus.TIMEOUT
        return PageStatus.ERROR

    def _k(self, keys: list[str]) -> list[str]:
        p = self.prefix
        return [p + k for k in keys]

    def _exists(self, keys: list[str]) -> int:
        pipe = self._client.pipeline(transaction=False)
        for k in self._k(keys):
            pipe.exists(k)
        n = 0
        for hit in pipe.execute():
            if not hit:
                break
            n += 1
        return n

    def _get(self, keys: list[str],
             max_payload: int = codec.MAX_PAGE_BYTES) -> list[bytes | memoryview | None]:
        return list(self._client.mget(self._k(keys)))

    def _put(self, keys: list[str], blobs: list[bytes]) -> list[PageStatus]:
        pipe = self._client.pipeline(transaction=False)
        for k, b in zip(self._k(keys), blobs, strict=False):
            pipe.set(k, b, nx=True)
        out = []
        for r in pipe.execute(raise_on_error=False):
            if isinstance(r, Exception):
                if "OOM" in str(r):
                    out.append(PageStatus.FULL)
                    continue
                raise r
            out.append(PageStatus.OK if r else PageStatus.EXISTS)
        return out

    def _delete(self, keys: list[str]) -> list[PageStatus]:
        pipe = self._client.pipeline(transaction=False)
        for k in self._k(keys):
            pipe.delete(k)
        return [PageStatus.OK if r else PageStatus.MISS for r in pipe.execute()]

    def _discard(self, keys: list[str]) -> None:
        self._delete(keys)

    def _clear(self) -> None:
        batch: list[bytes] = []
        for k in self._client.scan_iter(match=self.prefix + "*", count=1000):
            batch.append(k)
            if len(batch) >= 1000:
                self._client.unlink(*batch)
                batch = []
        if batch:
            self._client.unlink(*batch)

    def _holding(self) -> tuple[int, int, int]:
        info = self._client.info("memory")
        keys = self._client.dbsize()
        evicted = self._client.info("stats").get("evicted_keys", -1)
        return int(keys), int(info.get("used_memory", -1)), int(evicted)

    def probe(self) -> None:
        """One PING: a server that is down or does not speak Redis is refused, naming it."""
        try:
            self._client.ping()
        except self._redis.RedisError as e:
            raise ValueError(f"redis {self.url}: no Redis server answers ({e})") from None

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 -- closing a dead connection is not a failure
            pass
