"""The KV-event publisher: a sink on the one event stream (it runs where the other sinks run:
the writer process, or the drain thread inline), never on the cache's thread.

After each batch of mutations the sinks' replica (``Journal``) has applied, it recomputes the
resident blocks of the nodes those mutations touched, diffs them against what it published,
and sends one ``KVEventBatch``: ``BlockStored`` per newly resident run of pages (parents before
children, ``parent_block_hash`` chained), ``BlockRemoved`` per (medium, group) for the rest.
The storage tier's medium (``blocks.medium_for`` of the cache's backend kind: ``DISK`` for the
file backend, ``EXTERNAL`` for redis / mooncake) gets a ``BlockStored`` when a page first lands
in L3 and no ``BlockRemoved`` when the tree deletes its node (the page stays in L3).
Frames are ``[topic, seq (8 bytes big-endian), msgpack batch]`` on a bound PUB socket; the last
``buffer_steps`` messages are kept for the replay ROUTER socket (request ``[id, b"",
start_seq]``, replies ``[id, b"", topic, seq, payload]``..., then ``[id, b"", b"", -1, b""]``),
served by a small thread of its own, at most ``replay_per_s`` requests a second per client
(a token bucket per ZMQ identity, ``replay_burst`` deep; the least recently seen of more than
1024 clients are forgotten). A failure is logged and counted, never raised.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from collections.abc import Iterable

import zmq

from radixscope.cache import events as ev
from radixscope.telemetry.kvevents import wire
from radixscope.telemetry.kvevents.blocks import (
    TIER_MEDIA,
    BlockKey,
    NodeHashes,
    groups_for,
    medium_for,
    node_blocks,
)
from radixscope.telemetry.kvevents.config import KvEventsConfig
from radixscope.telemetry.record.drops import Health

_TOUCHING = frozenset((ev.NODE_CREATE, ev.NODE_SPLIT, ev.NODE_DELETE, ev.COMP_STATE))


def try_endpoint(endpoint: str, kind: int, connect: bool = False) -> str | None:
    """Bind (``connect``: connect) a ZMQ socket of ``kind`` to ``endpoint`` once and let it
    go: None when ZMQ took the endpoint, else why not, in words. What it bound is free again
    when this returns: the socket lives in a context of its own, terminated here. (ZMQ closes
    a listener on its I/O thread after ``unbind`` and ``close`` return; a bind made at once,
    as ``setup``'s publisher does after ``check_endpoints``, found the port still taken in 10 of
    2,000 tries, a plain bind in 1,148 of 3,000. Terminating the context joins that thread.)"""
    ctx = zmq.Context(io_threads=1)
    try:
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if connect:
                sock.connect(endpoint)
            else:
                sock.bind(endpoint)
        except zmq.ZMQError as e:
            return zmq.strerror(e.errno)
        finally:
            sock.close()
    finally:
        ctx.term()
    return None


def _ipc_in_use(endpoint: str) -> bool:
    """Whether something accepts on an ``ipc://`` endpoint's socket file: ZMQ's bind would
    unlink that file (taking it from its owner) rather than fail, so it is not tried."""
    path = endpoint[len("ipc://"):]
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        return False  # a stale file: binding replaces it
    finally:
        probe.close()
    return True


def check_endpoints(config: KvEventsConfig) -> None:
    """Bind the publisher's endpoints once each and let them go, in this process: one that is
    in use (another engine, an earlier run still up) or that ZMQ cannot bind is a ValueError
    naming it. ``setup`` calls this before it creates the store: the publisher itself binds
    in the writer process, whose failure the host would learn of only at close, after the
    previous run's store was replaced. (``inproc://`` endpoints are this process's own; an
    ``ipc://`` one is checked by connecting to its socket file, never by binding it.)"""
    for name, endpoint, kind in (("endpoint", config.endpoint, zmq.PUB),
                                 ("replay_endpoint", config.replay_endpoint, zmq.ROUTER)):
        if endpoint is None or endpoint.startswith("inproc://"):
            continue
        if endpoint.startswith("ipc://"):
            why = "Address already in use" if _ipc_in_use(endpoint) else None
        else:
            why = try_endpoint(endpoint, kind)
        if why is not None:
            raise ValueError(f"kv_events {name} {endpoint}: cannot bind it: {why}")


class KvEventPublisher:
    """Publishes our cache's blocks: a ``Sink`` registered as ``kv_events``
    (``telemetry/sinks/base.py``), called by the fan-out on its own thread.

    Args:
        health: the sink side's counters (``kv_events.*`` notes, ``kv_events`` failures).
        **options: the ``KvEventsConfig`` fields (endpoints and buffer sizes).
    """

    def __init__(self, health: Health, **options: object) -> None:
        config = KvEventsConfig(**options)  # type: ignore[arg-type]
        self.config = config
        self.health = health
        self.topic = config.topic.encode()
        self.seq = 0
        self.sent_events = 0
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 500)
        self._pub.bind(config.endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buf: collections.deque[tuple[int, bytes]] = collections.deque(
            maxlen=config.buffer_steps)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._replay_thread: threading.Thread | None = None
        self.replay_endpoint: str | None = None
        if config.replay_endpoint:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
            router.setsockopt(zmq.LINGER, 0)
            router.bind(config.replay_endpoint)
            self.replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._replay_thread = threading.Thread(target=self._serve_replay, args=(router,),
                                                   name="radixscope-kv-events-replay",
                                                   daemon=True)
            self._replay_thread.start()
        self._journal = None
        self._hashes: NodeHashes | None = None
        self._resident: dict[int, dict[BlockKey, tuple[int, ...]]] = {}
        self._media = dict(TIER_MEDIA)
        # storage-medium blocks published: L3 keeps a page after the tree forgets its node (a
        # later match finds it by hash), so they are never removed on a node's deletion and
        # never stored twice; the backend's own LRU evictions are not observed
        self._l3: dict[BlockKey, set[int]] = {}
        self._groups: list = []
        self._ci: dict[str, int] = {}
        self._block_size = 1
        self._stopped = False
        self._buckets: collections.OrderedDict[bytes, tuple[float, float]] = \
            collections.OrderedDict()

    # ---- sink hooks -------------------------------------------------------------------------
    def attach(self, info: dict, snapshot: object, journal: object) -> None:
        """The cache attached: publish ``AllBlocksCleared`` and whatever it already holds
        (read from the fan-out's journal replica, which ``ops`` then finds up to date)."""
        cfg = info.get("config", {})
        comps = list(journal.components)  # type: ignore[attr-defined]
        self._journal = journal
        self._groups = groups_for(comps, cfg.get("sliding_window") or None)
        self._ci = {c: i for i, c in enumerate(comps)}
        self._block_size = int(info.get("page_size") or cfg.get("page_size") or 1)
        backend = self.config.storage_backend or (info.get("storage") or {}).get("backend")
        self._media = {**TIER_MEDIA, ev.TIER_STORAGE: medium_for(ev.TIER_STORAGE, backend)}
        self._l3 = {}
        nodes = journal.builder.nodes  # type: ignore[attr-defined]
        self._hashes = NodeHashes(nodes, self._block_size)
        events: list = [wire.AllBlocksCleared()]
        events += self._diff([n for n in nodes if n != 0])
        self._send(events)

    def ops(self, ops: object, accepted: list[tuple]) -> None:
        """Publish what a batch of mutations (already applied to the replica) changed."""
        journal = self._journal
        if journal is None or self._stopped:
            return
        if journal.broken:  # type: ignore[attr-defined]
            # records were dropped upstream: what is resident is unknown from here on
            self._stopped = True
            self.health.note("kv_events.stopped_at_gap")
            self._send([wire.AllBlocksCleared()])
            return
        touched: dict[int, None] = {}
        hashes = self._hashes
        for m in accepted:
            kind = m[2]
            if kind in _TOUCHING:
                touched[m[3]] = None
                if kind == ev.NODE_SPLIT:
                    hashes.forget(m[3])  # type: ignore[union-attr]
                    touched[m[6][0]] = None
                elif kind == ev.NODE_DELETE:
                    hashes.forget(m[3])  # type: ignore[union-attr]
        touched.pop(0, None)
        if touched:
            events = self._diff(list(touched))
            if events:
                self._send(events)

    def event(self, ts_ns: int, seq: int | None, kind: str, attrs: dict) -> None:
        """Engine events carry no blocks."""

    def flush(self) -> None:
        """Nothing is held back: every batch is sent when it is handled."""

    def close(self) -> None:
        self._stop.set()
        if self._replay_thread is not None:
            self._replay_thread.join(timeout=2.0)
        self._pub.close()
        self._ctx.term()

    # ---- the diff ---------------------------------------------------------------------------
    def _diff(self, touched: Iterable[int]) -> list:
        nodes = self._journal.builder.nodes  # type: ignore[union-attr]
        hashes = self._hashes
        assert hashes is not None
        old: dict[BlockKey, set[int]] = {}
        fresh: list[tuple[int, BlockKey, list[int]]] = []  # (node, key, page indices)
        l3_medium = self._media.get(ev.TIER_STORAGE)
        for nid in touched:
            for key, hs in self._resident.pop(nid, {}).items():
                old.setdefault(key, set()).update(hs)
        now: dict[BlockKey, set[int]] = {}
        for nid in touched:
            rec = nodes.get(nid)
            if rec is None:
                continue
            got = node_blocks(nid, rec, hashes, self._ci, self._groups, self._media)
            if not got:
                continue
            hs = hashes.of(nid)
            mine = {}
            for key, pages in got.items():
                ids = tuple(hs[p] for p in pages)
                mine[key] = ids
                now.setdefault(key, set()).update(ids)
                was = old.get(key, ())
                is_l3 = key[0] == l3_medium
                seen = self._l3.setdefault(key, set()) if is_l3 else ()
                new_pages = [p for p in pages if hs[p] not in was and hs[p] not in seen]
                if is_l3:
                    seen.update(ids)
                if new_pages:
                    fresh.append((nid, key, new_pages))
            self._resident[nid] = mine
        events: list = []
        if fresh:
            depth = self._depths([f[0] for f in fresh], nodes)
            fresh.sort(key=lambda f: (depth[f[0]], f[1]))
            for nid, key, pages in fresh:
                events.extend(self._stored(nid, nodes[nid], key, pages))
        for key, hs in sorted(old.items()):
            if key[0] == l3_medium:
                continue  # still in L3 (see ``_l3``)
            gone = hs - now.get(key, set())
            if gone:
                events.append(wire.BlockRemoved(sorted(gone), key[0], group_idx=key[1]))
        return events

    def _stored(self, nid: int, rec: list, key: BlockKey, pages: list[int]) -> list:
        """One ``BlockStored`` per contiguous run of pages."""
        hashes = self._hashes
        assert hashes is not None
        hs = hashes.of(nid)
        ps = self._block_size
        g = self._groups[key[1]]
        out = []
        runs: list[list[int]] = []
        for p in pages:
            if runs and runs[-1][-1] == p - 1:
                runs[-1].append(p)
            else:
                runs.append([p])
        for run in runs:
            first = run[0]
            parent = hs[first - 1] if first else hashes.parent_hash(nid)
            toks = list(rec[2][first * ps:(run[-1] + 1) * ps])
            out.append(wire.BlockStored(
                [hs[p] for p in run], parent, toks, ps, None, key[0], None,
                group_idx=g.idx, kv_cache_spec_kind=g.kind,
                kv_cache_spec_sliding_window=g.window))
        return out

    @staticmethod
    def _depths(nids: list[int], nodes: dict) -> dict[int, int]:
        out: dict[int, int] = {0: 0}
        for nid in nids:
            path = []
            n = nid
            while n not in out:
                path.append(n)
                n = nodes[n][0]
            d = out[n]
            for p in reversed(path):
                d += 1
                out[p] = d
        return out

    # ---- sockets ------------------------------------------------------------------------------
    def _send(self, events: list) -> None:
        batch = wire.KVEventBatch(ts=time.time(), events=events,
                                  data_parallel_rank=self.config.data_parallel_rank)
        payload = wire.encode_batch(batch)
        with self._lock:
            seq = self.seq
            self.seq += 1
            self._buf.append((seq, payload))
        try:
            self._pub.send_multipart((self.topic, wire.seq_bytes(seq), payload),
                                     flags=zmq.NOBLOCK, copy=False)
            self.sent_events += len(events)
        except zmq.Again:
            self.health.note("kv_events.dropped_messages")

    def _serve_replay(self, router: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(100):
                    continue
                frames = router.recv_multipart()
                with self.health.guard("kv_events.replay"):
                    self._reply(router, frames)
        finally:
            router.close()

    def _reply(self, router: zmq.Socket, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[2]) != 8:
            self.health.note("kv_events.bad_replay_requests")
            return
        client = frames[0]
        start = int.from_bytes(frames[2], "big", signed=True)
        if not self._admit_replay(client):
            self.health.note("kv_events.replay_rate_limited")
            router.send_multipart((client, b"", b"", wire.seq_bytes(-1), b""))
            return
        if start < 0:  # no consumer asks for that: answered with the end marker only
            self.health.note("kv_events.bad_replay_requests")
            router.send_multipart((client, b"", b"", wire.seq_bytes(-1), b""))
            return
        with self._lock:
            items = [(s, p) for s, p in self._buf if s >= start]
        for s, p in items:
            router.send_multipart((client, b"", self.topic, wire.seq_bytes(s), p))
        router.send_multipart((client, b"", b"", wire.seq_bytes(-1), b""))

    def _admit_replay(self, client: bytes, now: float | None = None) -> bool:
        """Take one token from ``client``'s bucket (refilled at ``replay_per_s``)."""
        cfg = self.config
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.pop(client, (float(cfg.replay_burst), now))
        tokens = min(float(cfg.replay_burst), tokens + (now - last) * cfg.replay_per_s)
        ok = tokens >= 1.0
        self._buckets[client] = (tokens - 1.0 if ok else tokens, now)
        while len(self._buckets) > 1024:
            self._buckets.popitem(last=False)
        return ok
