"""``tel.close()`` in process mode: the writer ends without tearing down its replica (issue 17:
at 100 k nodes the interpreter's exit freeing the replica was most of ``close()``), and nothing
recorded before ``close()`` is lost: every op is in the store, the store replays to the cache's
snapshot at the last seq, and the clean-close row is written."""

from __future__ import annotations

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from tests.kits.cachekit import Driver, make_config


def test_process_close_keeps_everything_and_the_writer_exits_cleanly(tmp_path):
    store = tmp_path / "close.db"
    tel = telemetry.setup(store=store, keyframe_every=50, capture_host_spans=False)
    cache = HiRadixCache(make_config(("full",), device_tokens=4096, host_tokens=0),
                         recorder=tel.recorder)
    d = Driver(cache)
    for i in range(300):
        d.insert([1 + i % 7, 2, 3 + i % 11, 100 + i, 5, 6])
        if i % 50 == 49:
            cache.evict(40)
    snap = cache.snapshot()
    tel.close()
    proc = tel.pipeline.transport.process
    assert proc.returncode == 0  # os._exit(0) after the sinks closed, not a kill or a crash
    with telemetry.open_store(store) as r:
        status = r.run_status()
        assert status["state"] == "closed" and status["clean"] is True
        assert r.last_seq() == snap.seq == status["last_seq"]
        assert r.state_at(r.last_seq()) == snap
        assert len(r.keyframes()) >= 2  # at attach and at least one every 50 mutations
        assert len(r.ops()) >= 300
    assert tel.stats()["dropped"] == {k: 0 for k in tel.stats()["dropped"]}
