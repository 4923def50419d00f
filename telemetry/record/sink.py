"""The recorder's per-op encoder (``telemetry/record/_sink.c``, built by ``pip install``).

``Sink`` is what the cache calls once per op when it is present: it writes the compact record
straight into one buffer, byte for byte what ``marshal.dumps(record, 2)`` writes, with no Python
object made per record (tests/telemetry/test_sink.py checks the bytes against marshal's). Where
the module was not built (no C compiler at install), is stale (another ``ABI``) or
``RADIXSCOPE_NATIVE=0`` is set, ``Sink`` is None and the recorder encodes each record with
``marshal`` in Python (``TelemetryRecorder.record``); ``ENCODER`` says which runs. ``Sink`` also
carries the C table the cache's native ledger finds on it to hand records over with no tuple
made (``cache/_direct.h``, "direct records" in ``cache/ledger.py``)."""

from __future__ import annotations

from radixscope.cache.native import load_built

ABI = 3  # _sink.c's SINK_ABI: a build with another number is stale

_sink = load_built("radixscope.telemetry.record._sink", ABI, "_sink.c",
                   "the recorder's Python encoder")
Sink = None if _sink is None else _sink.Sink
ENCODER = "python" if Sink is None else "native"
