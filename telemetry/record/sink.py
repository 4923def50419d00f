"""The recorder's per-op encoder (``telemetry/record/_sink.c``, built by ``pip install``).

``Sink`` is what the cache calls once per op when it is present: it writes the compact record
straight into one buffer, byte for byte what ``marshal.dumps(record, 2)`` writes, with no Python
object made per record (tests/telemetry/test_sink.py checks the bytes against marshal's). Where
the module was not built (no C compiler at install), is stale (another ``ABI``) or
``RADIXSCOPE_NATIVE=0`` is set, ``Sink`` is None and the recorder encodes each record with
``marshal`` in Python (``TelemetryRecorder.record``); ``ENCODER`` says which runs."""

from __future__ import annotations

import logging
import os

ABI = 1  # _sink.c's SINK_ABI: a build with another number is stale

try:
    from radixscope.telemetry.record import _sink
except ImportError:  # built without a C compiler: the recorder's Python path
    _sink = None
if os.environ.get("RADIXSCOPE_NATIVE", "1").strip() == "0":
    _sink = None
elif _sink is not None and getattr(_sink, "ABI", None) != ABI:
    logging.getLogger("radixscope.telemetry").warning(
        "%s was built from another _sink.c (ABI %s, this code needs %d): recording on the "
        "Python encoder; `pip install -e .` rebuilds it", _sink.__file__,
        getattr(_sink, "ABI", "none"), ABI)
    _sink = None

Sink = None if _sink is None else _sink.Sink
ENCODER = "python" if Sink is None else "native"
