"""Publisher settings: ``setup(kv_events=...)``, ``RADIXSCOPE_KV_EVENTS`` or the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass

from radixscope.telemetry.kvevents.blocks import STORAGE_MEDIA, STORAGE_MEDIUM_NAMES

ENV_ENDPOINT = "RADIXSCOPE_KV_EVENTS"
ENV_REPLAY = "RADIXSCOPE_KV_EVENTS_REPLAY"
ENV_TOPIC = "RADIXSCOPE_KV_EVENTS_TOPIC"
_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True)
class KvEventsConfig:
    """Where and how the publisher publishes (plain data: it travels to the writer process).

    Attributes:
        endpoint: the PUB socket's endpoint, which it binds (``tcp://127.0.0.1:5557``).
        replay_endpoint: the replay ROUTER socket's endpoint (bound), or None.
        topic: the first frame of every message.
        buffer_steps: messages kept for replay (oldest dropped first).
        hwm: the PUB socket's send high-water mark (messages beyond it are dropped by ZMQ).
        data_parallel_rank: the batch's third field.
        storage_backend: the storage tier's backend kind (``file``, ``redis``, ``mooncake``)
            or medium (``DISK``, ``EXTERNAL``, ``STORAGE``); None: the kind the cache reports
            (``info()["storage"]["backend"]``), published as ``blocks.medium_for`` says.
        replay_per_s / replay_burst: replay requests one client (ZMQ identity) may make per
            second, and in a burst; a request beyond them is answered with the end marker only
            and counted (``kv_events.replay_rate_limited``), so one client asking in a loop
            cannot keep the replay thread busy resending the buffer.
    """

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    hwm: int = 100_000
    data_parallel_rank: int = 0
    storage_backend: str | None = None
    replay_per_s: float = 20.0
    replay_burst: int = 40

    def __post_init__(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.startswith(_SCHEMES)):
                raise ValueError(f"kv_events {name}={v!r}: must be a ZMQ endpoint "
                                 f"starting with one of {_SCHEMES}")
        sb = self.storage_backend
        if sb is not None and (not isinstance(sb, str) or (
                sb.lower() not in STORAGE_MEDIA and sb.upper() not in STORAGE_MEDIUM_NAMES)):
            raise ValueError(f"kv_events storage_backend={sb!r}: must be a backend kind "
                             f"{sorted(STORAGE_MEDIA)} or a medium {list(STORAGE_MEDIUM_NAMES)}")
        if not isinstance(self.buffer_steps, int) or self.buffer_steps < 1:
            raise ValueError(f"kv_events buffer_steps={self.buffer_steps!r}: must be an int >= 1")
        rate = self.replay_per_s
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0 \
                or rate == float("inf"):
            raise ValueError(f"kv_events replay_per_s={rate!r}: must be a finite number > 0")
        burst = self.replay_burst
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"kv_events replay_burst={burst!r}: must be an int >= 1")


def resolve(kv_events: str | dict | KvEventsConfig | bool | None) -> KvEventsConfig | None:
    """The publisher's config from ``setup``'s argument, else the environment.

    ``None``: from ``RADIXSCOPE_KV_EVENTS`` (and ``..._REPLAY`` / ``..._TOPIC``) if set;
    ``False``: off; a string: the endpoint; a dict: ``KvEventsConfig`` fields.
    """
    if kv_events is False:
        return None
    if kv_events is None or kv_events is True:
        ep = os.environ.get(ENV_ENDPOINT)
        if not ep:
            if kv_events is True:
                raise ValueError(f"kv_events=True but {ENV_ENDPOINT} is not set")
            return None
        return KvEventsConfig(ep, os.environ.get(ENV_REPLAY) or None,
                              os.environ.get(ENV_TOPIC, ""))
    if isinstance(kv_events, KvEventsConfig):
        return kv_events
    if isinstance(kv_events, str):
        return KvEventsConfig(kv_events)
    if isinstance(kv_events, dict):
        return KvEventsConfig(**kv_events)
    raise TypeError(f"kv_events={kv_events!r}: expected an endpoint, a dict or KvEventsConfig")
