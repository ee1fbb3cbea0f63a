"""Ports for the servers the tests start (portals, hubs and their proxies, replay models).

A port taken by binding to port 0 comes from the kernel's ephemeral range (32768-60999 on these
machines), where every outgoing connection also takes its local port: between the test asking
for the port and its server binding it, a connection can take it, and the server fails with
"Address already in use" (seen in a CI run: a hub's port). Ports here are drawn below that range
and below the egress proxies' draw (`infra.egress.proxy.PORTS`), checked free,
and never handed out twice by one test process.

The suite runs in several pytest-xdist worker processes at once: each draws from its own slice
of the range (by its worker number), so that two workers never hand out the same port in the
moment between one's check and its server's bind.
"""

from __future__ import annotations

import os
import random
import re
import socket

ALL_TEST_PORTS = range(10000, 20000)


def _slice_of(worker: str, workers: int) -> range:
    """The ports of xdist worker `worker` (``gw3``) of `workers`; the whole range outside xdist."""
    match = re.fullmatch(r"gw(\d+)", worker)
    if match is None or workers < 2:
        return ALL_TEST_PORTS
    size = len(ALL_TEST_PORTS) // workers
    start = ALL_TEST_PORTS.start + int(match.group(1)) * size
    return range(start, start + size)


TEST_PORTS = _slice_of(
    os.environ.get("PYTEST_XDIST_WORKER", ""),
    int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
)
_given: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 nothing is bound to, that no connection will take on its own."""
    for _ in range(500):
        port = random.choice(TEST_PORTS)
        if port in _given:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {TEST_PORTS.start}-{TEST_PORTS.stop - 1} on 127.0.0.1")
