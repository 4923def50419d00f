"""KV events for the L3 tier: our storage-backed cache publishes its L3 writes under the
storage medium (SGLang's ``DISK`` for the file backend), through the real ZMQ publisher, read
back by the consumer kit (replay socket, strict checks: contiguous seqs, parents first, nothing
removed that was never stored)."""

from __future__ import annotations

import msgspec
import pytest
import zmq

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.cache.storage import FileBackend, PrefetchConfig
from radixscope.cache.storage.setup import StorageSetup
from radixscope.telemetry.kvevents.blocks import medium_for
from radixscope.telemetry.kvevents.config import KvEventsConfig
from tests.kits import kvevents_consumer as kit
from tests.kits.cachekit import Driver, make_config
from tests.kits.l3kit import evict_everything, wait_prefetch
from tests.kits.ports import free_port

PAGE = 4
TOKENS = list(range(1, 1 + 6 * PAGE))


def test_medium_names():
    assert (medium_for("device"), medium_for("host")) == ("GPU", "CPU")
    assert medium_for("storage", "file") == "DISK"
    assert medium_for("storage", "redis") == medium_for("storage", "mooncake") == "EXTERNAL"
    assert medium_for("storage", "faulty(gate(file))") == "DISK"
    assert medium_for("storage", "disk") == "DISK"
    assert medium_for("storage") == medium_for("storage", "lmcache") == "STORAGE"
    with pytest.raises(ValueError, match="storage_backend='nfs'"):
        KvEventsConfig("tcp://127.0.0.1:1", storage_backend="nfs")


def _events(replay: str, until: int) -> list[tuple[int, object]]:
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay)
    try:
        got = kit.fetch_replay(dealer, 0, until, 10_000)
    finally:
        dealer.close()
        ctx.term()
    dec = msgspec.msgpack.Decoder(kit.KVEventBatch)
    return [(s, dec.decode(p)) for s, p in got]


def test_l3_writes_publish_the_storage_medium_once(tmp_path):
    pub, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    tel = telemetry.setup(store=None, mode="inline", metrics=False, spans=False,
                          capture_host_spans=False,
                          kv_events={"endpoint": pub, "replay_endpoint": rep})
    cfg = make_config(("full",), page_size=PAGE, device_tokens=64 * PAGE, host_tokens=64 * PAGE)
    c = HiRadixCache(cfg, tel.recorder, storage=StorageSetup(
        FileBackend(tmp_path / "l3"), prefetch=PrefetchConfig(
            policy="wait_complete", threshold_tokens=PAGE, batch_pages=4, max_host_share=1.0)))
    Driver(c).insert(TOKENS, req_id="w")
    c.poll(wait=True)          # device -> host -> L3
    tel.flush()
    evict_everything(c)        # the tree forgets the node; its pages stay in L3
    tel.flush()
    assert c.match_prefix(TOKENS, req_id="r", prefetch=True).prefetch_status == "started"
    wait_prefetch(c, "r")      # back to host from L3: STORAGE again, nothing new in L3
    c.storage_close()
    publisher = tel.pipeline.transport.sink.named["kv_events"]
    tel.flush()
    until = publisher.seq
    batches = _events(rep, until)
    tel.close()
    st = kit.State()
    for seq, b in batches:
        st.check(seq, b)
    assert st.errors == [] and st.last == until - 1
    stored: dict[str, list[int]] = {}
    removed: dict[str, list[int]] = {}
    for _seq, b in batches:
        for e in b.events:
            if isinstance(e, kit.BlockStored):
                stored.setdefault(e.medium, []).extend(e.block_hashes)
            elif isinstance(e, kit.BlockRemoved):
                removed.setdefault(e.medium, []).extend(e.block_hashes)
    assert set(stored) == {"GPU", "CPU", "DISK"}
    disk = stored["DISK"]
    assert len(disk) == len(set(disk)) == len(TOKENS) // PAGE  # each page once
    assert set(disk) == set(stored["GPU"])                     # the same chained hashes
    assert "DISK" not in removed                                # still in L3
    assert set(removed["GPU"]) == set(disk)
    # host: stored by the backup, removed by evict_host, stored again by the hand-back
    assert sorted(stored["CPU"]) == sorted(disk * 2) and sorted(removed["CPU"]) == sorted(disk)
