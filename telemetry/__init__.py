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
``telemetry.writer`` without pandas (the reader's) or torch (the cache's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cache.lazy import lazy_exports

_EXPORTS = {
    "setup": "telemetry.setup",
    "Telemetry": "telemetry.handle",
    "TelemetryRecorder": "telemetry.recorder",
    "Health": "telemetry.health",
    "open_store": "telemetry.reader",
    "StoreReader": "telemetry.reader",
    "export_perfetto": "telemetry.perfetto",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from telemetry.handle import Telemetry
    from telemetry.health import Health
    from telemetry.perfetto import export_perfetto
    from telemetry.reader import StoreReader, open_store
    from telemetry.recorder import TelemetryRecorder
    from telemetry.setup import setup


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
