"""Free loopback ports for the servers tests start (redis-server, Mooncake, ZMQ publishers,
Streamlit, Prometheus).

A port picked by binding port 0 and closing the socket is only free until somebody else takes
it, and the kernel hands the same range to every outgoing connection: a connection another
thread or process opens in between (a client of an earlier test, the writer process) can get
that very port, and the server's bind then fails with "Address already in use". So
``free_port`` picks outside the kernel's ephemeral range, where no connection is given a local
port, checks that nothing is bound there, and never hands out one port twice in a process (two
servers of one test each get their own)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10_000  # below: well-known and registered services
_given: set[int] = set()
_rng = random.Random()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unread)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _candidates():
    """Bindable ports outside the ephemeral range when there is room there, then the kernel's
    own picks."""
    lo, hi = ephemeral_range()
    outside = [(a, b) for a, b in ((LOWEST, lo - 1), (hi + 1, 65535)) if b - a >= 100]
    for _ in range(200 if outside else 0):
        port = _rng.randint(*_rng.choice(outside))
        if _bindable(port):
            yield port
    while True:  # no room outside the ephemeral range, or nothing free there
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            yield s.getsockname()[1]


def free_port() -> int:
    """A loopback TCP port nothing is bound to, outside the ephemeral range when there is room
    there, and not handed out before in this process."""
    port = next(p for p in _candidates() if p not in _given)
    _given.add(port)
    return port
