"""An exec's output arriving in the same read as the engine's "101 UPGRADED" answer is kept.

A small engine on a unix socket answers the exec's start with the answer and the output in one
write, as an engine reached over SSH often does (answer and first frames in one packet). The
Docker SDK's own reader then returns nothing; `ExecConnection` returns every frame.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker import APIClient

from infra.exec_stream import ExecConnection

ANSWER = (
    b"HTTP/1.1 101 UPGRADED\r\n"
    b"Content-Type: application/vnd.docker.raw-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)


def _frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


OUTPUT = _frame(1, b"65536\n") + _frame(2, b"a warning\n") + _frame(1, b"x" * 70_000)


class _Engine:
    """Answers every request on its socket with ANSWER + `output`, in one write, then closes."""

    def __init__(self, path: Path, output: bytes) -> None:
        self.output = output
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        self.stdin = bytearray()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(ANSWER + self.output)
                conn.shutdown(socket.SHUT_WR)
                while chunk := conn.recv(65536):  # what the client writes to stdin
                    self.stdin += chunk

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[_Engine, APIClient]]:
    path = tmp_path / "engine.sock"
    served = _Engine(path, OUTPUT)
    api = APIClient(base_url=f"unix://{path}", version="1.41", timeout=10)
    yield served, api
    api.close()
    served.close()


def test_output_read_with_the_answer_is_kept(engine: tuple[_Engine, APIClient]) -> None:
    _, api = engine
    connection = ExecConnection(api, "abc")
    try:
        frames = list(connection.frames())
    finally:
        connection.close()
    assert frames == [(1, b"65536\n"), (2, b"a warning\n"), (1, b"x" * 70_000)]


def test_the_sdk_reader_loses_it(engine: tuple[_Engine, APIClient]) -> None:
    """Why ExecConnection exists: the SDK reads past the buffer that holds the first frames.
    (Should this start failing, the SDK reads them now and ExecConnection can go.)"""
    _, api = engine
    output = api.exec_start("abc")
    assert not output.startswith(b"65536"), output[:40]


def test_a_frame_cut_short_ends_the_output(tmp_path: Path) -> None:
    path = tmp_path / "engine.sock"
    served = _Engine(path, _frame(1, b"whole\n") + _frame(1, b"cut")[:-1])
    api = APIClient(base_url=f"unix://{path}", version="1.41", timeout=10)
    try:
        connection = ExecConnection(api, "abc")
        assert list(connection.frames()) == [(1, b"whole\n"), (1, b"cu")]
        connection.send(b"to stdin")
        connection.close()
    finally:
        api.close()
        served.close()
    served.thread.join(5)
    assert bytes(served.stdin) == b"to stdin"
