"""``TelemetryOptions``: telemetry's tuning knobs, one value instead of a parameter each.

``telemetry.setup`` takes the common choices as its own arguments (store, mode, exporters,
providers) and everything that tunes the pipeline here, so a new knob or a new output never
adds a parameter to ``setup``. The knobs' names are also accepted as keywords of ``setup``
itself (``setup(keyframe_every=40)`` is ``setup(options=TelemetryOptions(keyframe_every=40))``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TelemetryOptions:
    """How the pipeline is tuned (defaults are setup's defaults).

    Attributes:
        keyframe_every: mutations between keyframe snapshots in the store, at least.
        keyframe_nodes: and at least this many times the replica's node count (0: off). A
            keyframe costs the writer time in proportion to the node count (0.3 s at 100 k
            nodes): with this, keyframes cost each mutation a bounded share at any tree size,
            and ``state_at`` replays at most about as many mutations as a keyframe holds nodes.
        sample_every_ms: cache time between pool metric samples in the store.
        queue_capacity: op records the recorder buffers before its overflow policy applies.
        overflow: ``"block"`` (wait up to ``block_timeout_s``, then drop) or ``"drop"``.
        block_timeout_s: see ``overflow``.
        drain_interval_s: drain period (the store and exporters lag the cache by about this).
        capture_context: capture the caller's OTel context per op (span parenting).
        writer_nice: niceness increment of the writer process (0 = same priority).
        flight_ring: op records ``tel.recorder.tail()`` keeps after shipping (0: none).

    Raises:
        ValueError: a value out of range (naming it), at construction.
    """

    keyframe_every: int = 20000
    keyframe_nodes: float = 2.0
    sample_every_ms: float = 100.0
    queue_capacity: int = 262144
    overflow: str = "block"
    block_timeout_s: float = 2.0
    drain_interval_s: float = 0.1
    capture_context: bool = True
    writer_nice: int = 10
    flight_ring: int = 4096

    def __post_init__(self) -> None:
        if (not isinstance(self.keyframe_every, int) or isinstance(self.keyframe_every, bool)
                or self.keyframe_every < 1):
            raise ValueError(f"keyframe_every={self.keyframe_every!r}: must be an int >= 1")
        if (isinstance(self.keyframe_nodes, bool) or not isinstance(self.keyframe_nodes,
                                                                    (int, float))
                or not self.keyframe_nodes >= 0):
            raise ValueError(f"keyframe_nodes={self.keyframe_nodes!r}: must be a number >= 0")
        if self.sample_every_ms < 0:
            raise ValueError(f"sample_every_ms={self.sample_every_ms!r}: must be >= 0")

    @classmethod
    def merged(cls, options: TelemetryOptions | None, knobs: Mapping[str, Any]
               ) -> TelemetryOptions:
        """``options`` (or the defaults) with ``knobs`` (keywords named like the fields) on top.

        Raises:
            TypeError: ``options`` is not a ``TelemetryOptions``, or a keyword names no knob.
        """
        if options is None:
            options = cls()
        elif not isinstance(options, cls):
            raise TypeError(f"options={options!r}: must be a TelemetryOptions")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(knobs) - known)
        if unknown:
            raise TypeError(f"setup() got unexpected keyword argument(s) {unknown}; "
                            f"tuning knobs are {sorted(known)} (TelemetryOptions)")
        return dataclasses.replace(options, **knobs) if knobs else options
