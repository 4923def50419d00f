"""OTel metrics from the event stream, read with an ``InMemoryMetricReader``."""

from __future__ import annotations

import torch

from radixscope import telemetry
from radixscope.cache import HiRadixCache
from radixscope.telemetry import names as n
from tests.kits.cachekit import Driver, make_config
from tests.kits.ports import free_port
from tests.kits.telkit import Rig, by_labels, metric_points

A = [1, 2, 3, 4, 5, 6, 7, 8]


def test_pool_gauges_equal_the_snapshot_pools(tmp_path):
    rig = Rig(tmp_path, ("full", "swa", "mamba"), metrics=True, device_tokens=24,
              host_tokens=48)
    d = Driver(rig.cache)
    for i in range(5):
        d.insert(A[: 3 + i] + [50 + i])
    rec = rig.cache.lock(d.insert(A).last_node, owner="x")  # something protected
    rig.tel.flush()
    pts = metric_points(rig.reader)
    snap = rig.cache.snapshot()
    for gauge, field in ((n.M_POOL_CAPACITY, "capacity"), (n.M_POOL_AVAILABLE, "available"),
                         (n.M_POOL_EVICTABLE, "evictable"), (n.M_POOL_PROTECTED, "protected"),
                         (n.M_POOL_IN_FLIGHT, "in_flight"), (n.M_POOL_HELD, "held")):
        got = {k: p.value for k, p in by_labels(pts[gauge], n.LABEL_COMPONENT,
                                                n.LABEL_TIER).items()}
        want = {(p.component, p.tier): getattr(p, field) for p in snap.pools}
        assert got == want, gauge
    assert snap.pool("full", "device").protected >= 8  # the lock, plus nodes in transfer
    assert snap.pool("full", "host").in_flight > 0  # write-through backups not yet acked
    rig.cache.unlock(rec)
    rig.close()


def test_counters_and_histograms(tmp_path):
    rig = Rig(tmp_path, metrics=True, device_tokens=16, host_tokens=32)
    c, d = rig.cache, Driver(rig.cache)
    d.insert(A)
    c.poll()  # backup of 8 tokens acked
    c.evict(8)  # 8 device tokens freed
    m = c.match_prefix(A + [9, 10])  # host hit of 8
    lb = c.load_back(m)
    c.poll()  # load-back of 8 acked
    new = c.alloc(2)
    c.insert(A + [9, 10], torch.cat([lb.device_indices, new]), prev_prefix_len=8)
    rig.tel.record_admission("r1", True)
    rig.tel.record_admission("r2", False)
    rig.tel.flush()
    pts = metric_points(rig.reader)
    hits = {k: p.value for k, p in by_labels(pts[n.M_HIT_TOKENS], n.LABEL_COMPONENT,
                                             n.LABEL_TIER).items()}
    assert hits == {("full", "host"): 8}
    assert [p.value for p in pts[n.M_LOOKUP_TOKENS]] == [8 + 10]
    evicted = {k: p.value for k, p in by_labels(pts[n.M_EVICTED_TOKENS], n.LABEL_COMPONENT,
                                                n.LABEL_TIER).items()}
    assert evicted == {("full", "device"): 8}
    assert {k: p.value for k, p in by_labels(pts[n.M_BACKUP_TOKENS], n.LABEL_COMPONENT).items()
            } == {("full",): 8}
    assert {k: p.value for k, p in by_labels(pts[n.M_LOAD_BACK_TOKENS],
                                             n.LABEL_COMPONENT).items()} == {("full",): 8}
    per_slot = 2 * 2 * 1 * 4 * 4  # layers x (k, v) x heads x head_dim x 4 bytes (float32)
    assert [p.value for p in pts[n.M_BACKUP_BYTES]] == [8 * per_slot]
    assert [p.value for p in pts[n.M_LOAD_BACK_BYTES]] == [8 * per_slot]
    durations = by_labels(pts[n.M_OP_DURATION], n.LABEL_OP)
    assert {k[0]: p.count for k, p in durations.items()} == {
        "match": 2, "lock": 1, "alloc": 2, "insert": 2, "unlock": 1, "evict": 1,
        "load_back": 1}
    transfers = by_labels(pts[n.M_TRANSFER_DURATION], n.LABEL_TRANSFER_KIND)
    assert {k[0]: p.count for k, p in transfers.items()} == {"backup": 1, "load_back": 1}
    adm = {k[0]: p.value for k, p in by_labels(pts[n.M_ADMISSIONS],
                                               n.LABEL_ADMISSION_RESULT).items()}
    assert adm == {"admitted": 1, "rejected": 1}
    dropped = {k[0]: p.value for k, p in by_labels(pts[n.M_TELEMETRY_DROPPED],
                                                   n.LABEL_RECORD).items()}
    assert dropped == {"op": 0, "mutation": 0, "span": 0, "event": 0}
    rig.close()


def test_metric_labels_are_closed_sets(tmp_path):
    rig = Rig(tmp_path, ("full", "swa"), metrics=True, device_tokens=16, host_tokens=32)
    d = Driver(rig.cache)
    for i in range(6):
        d.insert([i, i + 1, i + 2, 7])
        rig.cache.poll()
    rig.cache.evict(12)
    rig.tel.flush()
    for name, points in metric_points(rig.reader).items():
        if not name.startswith("kv_cache."):
            continue
        for p in points:
            assert set(p.attributes) == set(n.METRIC_LABELS[name]), name
            assert not any("node" in k or "request" in k for k in p.attributes)
    rig.close()


def test_dropped_records_show_in_the_counter():
    tel = telemetry.setup(store=None, in_memory=True, overflow="drop", queue_capacity=1,
                          drain_interval_s=60.0, capture_host_spans=False)
    c = HiRadixCache(make_config(), recorder=tel.recorder)
    Driver(c).insert([1, 2, 3])  # 5 ops, 1 fits
    tel.flush()
    pts = metric_points(tel.metric_reader)
    dropped = {k[0]: p.value for k, p in by_labels(pts[n.M_TELEMETRY_DROPPED],
                                                   n.LABEL_RECORD).items()}
    assert dropped["op"] == 4
    assert [s.name for s in tel.memory_exporter.get_finished_spans()] == [n.SPAN_MATCH]
    tel.close()


def test_prometheus_endpoint_serves_the_cache_metrics(tmp_path):
    """``setup(prometheus=port)``: the writer process serves the instruments over HTTP; a real
    scrape sees the pool gauges per component and tier and the counters, with their values."""
    import urllib.request

    port = free_port()
    tel = telemetry.setup(store=tmp_path / "p.db", prometheus=("127.0.0.1", port),
                          capture_host_spans=False)
    try:
        c = HiRadixCache(make_config(("full", "swa")), recorder=tel.recorder)
        d = Driver(c)
        d.insert(A)
        c.match_prefix(A)
        tel.flush()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    finally:
        tel.close()
    text = body.decode()
    avail = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
             if line.startswith("kv_cache_pool_available")}
    snap = {(p.component, p.tier): p.available for p in c.snapshot().pools}
    for (comp, tier), value in snap.items():
        key = next(k for k in avail if f'component="{comp}"' in k and f'tier="{tier}"' in k)
        assert avail[key] == value
    assert "kv_cache_hit_tokens" in text and "kv_cache_op_duration" in text
