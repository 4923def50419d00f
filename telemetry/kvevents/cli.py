"""``radixscope watch`` and the ``run --kv-events`` options (registered by ``engine/cli.py``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator

from radixscope.telemetry.kvevents.config import ENV_ENDPOINT, ENV_REPLAY


def add_watch_parser(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("watch", help="subscribe to an engine's KV events (vLLM, SGLang) and "
                                     "write its tree to a store")
    w.add_argument("endpoint", help="the engine's KV-event PUB endpoint, e.g. tcp://host:5557")
    w.add_argument("--replay", metavar="ENDPOINT", help="the engine's replay endpoint")
    w.add_argument("--topic", default="", help="topic prefix to subscribe to (default: all)")
    w.add_argument("--store", required=True, metavar="FILE", help="the store to write")
    w.add_argument("--overwrite", action="store_true", help="replace an existing store")
    w.add_argument("--max-seconds", type=float, default=None, help=argparse.SUPPRESS)


def add_run_options(r: argparse.ArgumentParser) -> None:
    r.add_argument("--kv-events", metavar="ENDPOINT",
                   help="publish vLLM-format KV events on a PUB socket bound here "
                        "(e.g. tcp://127.0.0.1:5557)")
    r.add_argument("--kv-events-replay", metavar="ENDPOINT",
                   help="bind the KV-event replay ROUTER socket here")


def check_run_options(ns: argparse.Namespace) -> None:
    """``run``'s KV-event options, before anything is set.

    Raises:
        ValueError: ``--kv-events-replay`` without ``--kv-events``, or either with
            ``--no-store`` (no telemetry: nothing would publish)."""
    endpoint, replay = getattr(ns, "kv_events", None), getattr(ns, "kv_events_replay", None)
    if replay and not endpoint:
        raise ValueError(f"--kv-events-replay {replay} needs --kv-events (the replay socket "
                         "serves what the PUB socket published)")
    if endpoint and getattr(ns, "no_store", False):
        raise ValueError("--kv-events needs telemetry: drop --no-store")


@contextlib.contextmanager
def run_options(ns: argparse.Namespace) -> Iterator[None]:
    """``run --kv-events`` (checked by ``check_run_options``): the setting reaches
    ``telemetry.setup`` through its variables, set for the ``with`` block and put back after
    it, so a caller of ``main`` in its own process keeps its environment."""
    endpoint, replay = getattr(ns, "kv_events", None), getattr(ns, "kv_events_replay", None)
    saved = {k: os.environ.get(k) for k in (ENV_ENDPOINT, ENV_REPLAY)}
    if endpoint:
        os.environ[ENV_ENDPOINT] = endpoint
        if replay:
            os.environ[ENV_REPLAY] = replay
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cmd_watch(ns: argparse.Namespace) -> int:
    from radixscope.telemetry.kvevents.watch import Watcher

    try:
        for name, endpoint in (("endpoint", ns.endpoint), ("--replay", ns.replay)):
            _check_connectable(name, endpoint)  # before the store is made
        w = Watcher(ns.endpoint, ns.store, replay=ns.replay, topic=ns.topic,
                    overwrite=ns.overwrite)
    except (ValueError, FileExistsError, OSError) as e:
        print(f"radixscope watch: error: {e}", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: w.stop())
    print(f"radixscope watch: {ns.endpoint} -> {w.path} (Ctrl-C to stop)", file=sys.stderr,
          flush=True)
    counts = w.run(max_s=ns.max_seconds)
    print(f"radixscope watch: {w.messages} messages, {counts.get('stored_blocks', 0)} blocks "
          f"stored, {counts.get('removed_blocks', 0)} removed, "
          f"{counts.get('bad_frames', 0)} bad frames, gaps {w.gaps}", file=sys.stderr)
    return 0


def _check_connectable(name: str, endpoint: str | None) -> None:
    """A ZMQ endpoint ``watch`` can connect to (the peer need not be up yet: ZMQ reconnects);
    a malformed one is a ValueError naming it."""
    if endpoint is None:
        return
    import zmq

    from radixscope.telemetry.kvevents.publisher import try_endpoint

    why = try_endpoint(endpoint, zmq.SUB, connect=True)
    if why is not None:
        raise ValueError(f"{name} {endpoint!r} is not an endpoint to connect to ({why}; e.g. "
                         "tcp://127.0.0.1:5557)")
