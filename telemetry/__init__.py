"""radixscope telemetry: the cache's one event stream -> OTel spans, OTel metrics and an
embedded SQLite store that rebuilds the tree at any seq.

    tel = telemetry.setup(store="runs/run.db")
    cache = HiRadixCache(config, recorder=tel.recorder)
    ...
    tel.close()
    with telemetry.open_store("runs/run.db") as r:
        r.spans(); r.mutations(); r.state_at(r.last_seq())

See ``docs/telemetry.md`` for every span, attribute, metric and table.
"""

from telemetry.handle import Telemetry
from telemetry.health import Health
from telemetry.perfetto import export_perfetto
from telemetry.reader import StoreReader, open_store
from telemetry.recorder import TelemetryRecorder
from telemetry.setup import setup

__all__ = ["setup", "Telemetry", "TelemetryRecorder", "Health", "open_store", "StoreReader",
           "export_perfetto"]
