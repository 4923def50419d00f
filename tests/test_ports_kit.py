"""The tests' free-port kit (``tests/kits/ports.py``): a port a test's server binds must not be
one an outgoing connection can take meanwhile, nor one handed to another server of the run."""

from __future__ import annotations

import socket

from tests.kits.ports import LOWEST, ephemeral_range, free_port


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    lo, hi = ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    if lo - LOWEST >= 100:  # room below the range (Linux's default: 32768-60999)
        assert all(not lo <= p <= hi for p in ports), [p for p in ports if lo <= p <= hi]
    for p in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_never_handed_out() -> None:
    held = []
    try:
        for _ in range(50):  # hold every port handed out: the next one must still be bindable
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            s.listen()
            held.append(s)
    finally:
        for s in held:
            s.close()
