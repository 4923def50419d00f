"""radixscope telemetry: the cache's one event stream -> OTel spans, OTel metrics and an
embedded SQLite store that rebuilds the tree at any seq.

    tel = telemetry.setup(store="runs/run.db")
    cache = HiRadixCache(config, recorder=tel.recorder)
    ...
    tel.close()
    with telemetry.open_store("runs/run.db") as r:
        r.spans(); r.mutations(); r.state_at(r.last_seq())

See ``docs/telemetry.md`` for every span, attribute, metric and table.

The names below are imported on first use (PEP 562): the writer process imports
``telemetry.sinks.writer_process`` without pandas (the reader's) or torch (the cache's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixscope.cache.lazy import lazy_exports

_EXPORTS = {
    "setup": "radixscope.telemetry.setup",
    "Telemetry": "radixscope.telemetry.handle",
    "TelemetryOptions": "radixscope.telemetry.options",
    "TelemetryRecorder": "radixscope.telemetry.record.recorder",
    "Health": "radixscope.telemetry.record.drops",
    "open_store": "radixscope.telemetry.store.reader",
    "StoreReader": "radixscope.telemetry.store.reader",
    "export_perfetto": "radixscope.telemetry.store.perfetto",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from radixscope.telemetry.handle import Telemetry
    from radixscope.telemetry.options import TelemetryOptions
    from radixscope.telemetry.record.drops import Health
    from radixscope.telemetry.record.recorder import TelemetryRecorder
    from radixscope.telemetry.setup import setup
    from radixscope.telemetry.store.perfetto import export_perfetto
    from radixscope.telemetry.store.reader import StoreReader, open_store


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
