"""Whether a port a server of Baseline's is about to listen on is free: asked before anything
starts, so that a taken port is said at once, by number, and nothing is left half started."""

from __future__ import annotations

import errno
import socket


class PortInUse(OSError):
    """A port a server needs is taken; the message names the server, the port and what to do."""

    def __init__(self, what: str, host: str, port: int, why: str, hint: str) -> None:
        super().__init__(errno.EADDRINUSE, f"{what} {port} on {host} is in use ({why}): {hint}")


def is_free(host: str, port: int) -> bool:
    """Whether `port` on `host` can be bound now (the probe is closed at once: until its server
    binds, a client is refused rather than left waiting on a port nothing answers yet)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True
