"""The writer process keeps the memory it frees (issue 17): each batch's blobs and decoded objects
reuse the last batch's pages instead of fresh ones the kernel must zero, memory traffic that
lands on the cache's thread. Real pipeline (writer process, SQLite store), bench_scale's chat
workload at ~1 k nodes."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from radixscope import telemetry
from radixscope.telemetry.sinks import writer_process

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale_workload as sw  # noqa: E402

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt: glibc on Linux")
def test_a_warm_writer_takes_next_to_no_page_faults_a_batch(tmp_path):
    tel = telemetry.setup(store=tmp_path / "w.db")
    try:
        c = sw.make_cache(1000, ("full",), tel.recorder)
        chat = sw.Chat(active=1000 // 12)
        i = sw.fill(c, chat, 1000)
        # the fill's backlog stored first, as bench_scale.py does: without it, the batches ran
        # on the heap that backlog had grown and took few faults with glibc's defaults too
        tel.flush()
        faults = []
        for _ in range(8):  # batches of 1,500 requests, run back to back as bench_scale.py's
            keys = [chat.next() for _ in range(1500)]
            for key in keys:
                sw.one_request(c, key, None, f"r{i}")
                i += 1
            tel.flush()
            faults.append(tel.pipeline.last_stats["process"]["minor_faults"])
        proc = tel.pipeline.last_stats["process"]
        assert proc["malloc"] == {name: v for name, _, v in writer_process._MALLOPT}
        per_batch = [b - a for a, b in zip(faults, faults[1:], strict=False)]
        # glibc's defaults: 500-3,000 faults in most batches; kept, most warm batches take none
        assert sorted(per_batch[2:])[2] < 100, per_batch
    finally:
        tel.close()
