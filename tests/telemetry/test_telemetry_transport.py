"""The data pipe to the writer process (``writer_process.send_message`` / ``recv_message``):
message batches arrive whole and in order over a real OS pipe, and the ``ops`` blobs travel as
frames of their own (pickled out of band), so the drain thread never copies a batch into a
pickle while it holds the GIL."""

from __future__ import annotations

import os
import threading
from multiprocessing.connection import Connection

from radixscope.telemetry.sinks.writer_process import recv_message, send_message


def pipe() -> tuple[Connection, Connection]:
    r, w = os.pipe()
    return Connection(r, writable=False), Connection(w, readable=False)


def test_message_batches_arrive_whole_and_in_order_with_their_blobs_as_bytes() -> None:
    reader, writer = pipe()
    big = bytes(range(256)) * 12_000  # ~3 MB: more than the pipe holds, so the reader runs
    batches = [
        [("ops", [big, b"[\x00\x00\x00\x00"]), ("event", 5, 7, "k", {"a": 1})],
        [("flush", 3)],
        [("ops", []), ("host_stats", {"dropped": {}})],
    ]
    got: list = []
    t = threading.Thread(target=lambda: got.extend(recv_message(reader) for _ in batches))
    t.start()
    try:
        for b in batches:
            send_message(writer, b)
    finally:
        t.join(timeout=30)
        writer.close()
        reader.close()
    assert got == batches
    assert type(got[0][0][1][0]) is bytes


def test_an_ops_blob_is_a_frame_of_its_own_not_copied_into_the_pickle() -> None:
    reader, writer = pipe()
    blob = b"[" + bytes(200_000)
    frames: list[bytes] = []
    t = threading.Thread(target=lambda: frames.extend(reader.recv_bytes() for _ in range(2)))
    t.start()
    try:
        send_message(writer, [("ops", [blob])])
    finally:
        t.join(timeout=30)
        writer.close()
        reader.close()
    head, body = frames
    assert int.from_bytes(head[:4], "little") == 1 and len(head) < 1_000
    assert body == blob
