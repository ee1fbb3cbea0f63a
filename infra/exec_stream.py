"""A started exec's output, every byte of it.

Starting an exec upgrades its HTTP request to a raw connection: the engine answers "101
UPGRADED" and then writes the command's output as frames (8-byte header: stream, length).
`http.client` parses the answer's header lines through a buffered reader, which reads the
connection in chunks and may take the first frames along with the header when they arrive
together. The Docker SDK then reads the frames from the socket under that reader, past its
buffer, and so loses them: a short command's output comes back empty with exit code 0. It
takes the answer and the first output arriving together, which is rare (0 of 1,000 `echo`s over
SSH on an idle machine) but happens under load: `df` of /dev/shm came back '' over SSH in a CI
run; docker/docker-py#3332 reports the same. Here the frames are read through that same buffered
reader, so the bytes it already holds come first (tests/infra/test_exec_stream.py makes the
engine send both in one write).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO, cast

from docker.api.client import APIClient

HEADER = struct.Struct(">BxxxL")  # stream (1 stdout, 2 stderr), payload length


class ExecConnection:
    """The upgraded connection of a started exec: frames in, raw socket for stdin and close."""

    def __init__(self, api: APIClient, exec_id: str) -> None:
        self.socket: Any = api.exec_start(exec_id, socket=True)
        # Reads wait as long as the command is silent: the client's timeout is for requests.
        api._disable_socket_timeout(self.socket)
        # The SDK keeps the HTTP response on the socket (so that it is not collected); its
        # buffered reader is the one that parsed the 101 answer and may hold the first frames.
        response = self.socket._response
        self._reader = cast(BinaryIO, response.raw._fp.fp)

    def frames(self) -> Iterator[tuple[int, bytes]]:
        """(stream, payload) until the command's output ends; a frame cut short ends it too."""
        while True:
            header = self._read(HEADER.size)
            if len(header) < HEADER.size:
                return
            stream, length = HEADER.unpack(header)
            payload = self._read(length)
            if payload:
                yield stream, payload
            if len(payload) < length:
                return

    def send(self, data: bytes) -> None:
        """Write to the command's stdin (an exec created with stdin=True); OSError if broken."""
        raw = getattr(self.socket, "_sock", self.socket)  # a local engine's socket.SocketIO
        raw.sendall(data)

    def close(self) -> None:
        """Close the connection (a socket, or a paramiko channel over SSH) and the HTTP
        response kept with it; a command still writing then ends on a broken pipe."""
        for closable in (self.socket, getattr(self.socket, "_response", None)):
            close = getattr(closable, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):  # already closed or broken: nothing to free
                    close()

    def _read(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self._reader.read(size - len(chunks))
            if not chunk:
                break
            chunks += chunk
        return bytes(chunks)
