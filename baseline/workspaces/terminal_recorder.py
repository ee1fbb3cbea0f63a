"""The terminal recorder that runs inside an attempt's container (standard library only).

A record the participant could edit is no record: a file written by the participant's own
process (``script``, bash's ``history -a``) can be truncated by them. So the participant's
processes only *send*: ``serve`` runs as root (started by `terminal_records.start_recorder`),
listens on a Unix socket anyone in the container may connect to, and appends what each
connection sends to a file it alone opens for writing, under a root-owned directory the
participant can read but not write. A connection cannot name its file (the recorder names a
session after the time and the sender's pid), so nothing already recorded can be overwritten,
shortened or removed by the participant; killing a sender only ends that recording.

``send KIND [FIFO]`` runs as the participant: it copies its input (or the FIFO's, which it
removes once open) to the recorder. When the recorder does not answer it appends to the
fallback file under /home/logs instead, so a terminal never dies of its recording and nothing
is lost (those files are the participant's, checked for tampering at collection).

This file is copied into the container as it is (`terminal_records.place_in_workspace`), so it
imports nothing of Baseline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import sys
import threading
import time

SOCKET_PATH = "/run/baseline-recorder.sock"
RECORD_ROOT = "/var/log/baseline"
TERMINAL_DIR = RECORD_ROOT + "/terminal"
HISTORY_FILE = RECORD_ROOT + "/shell_history"
FALLBACK_TERMINAL_DIR = "/home/logs/terminal"
FALLBACK_HISTORY_FILE = "/home/logs/shell_history"
KINDS = {b"s": "session", b"h": "history"}
CHUNK = 1 << 16


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _record(conn: socket.socket) -> None:
    """One sender: its first byte says what it sends; the rest is appended to its file."""
    with conn:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        kind = KINDS.get(conn.recv(1))
        if kind is None:
            return
        path = f"{TERMINAL_DIR}/{_stamp()}-{pid}.typescript" if kind == "session" else HISTORY_FILE
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while chunk := conn.recv(CHUNK):
                _write_all(fd, chunk)
        finally:
            os.close(fd)


def serve() -> None:
    """As root: make the record directories root's, then record every connection."""
    os.makedirs(TERMINAL_DIR, mode=0o755, exist_ok=True)
    for directory in (RECORD_ROOT, TERMINAL_DIR):
        os.chmod(directory, 0o755)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET_PATH)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(SOCKET_PATH)
    os.chmod(SOCKET_PATH, 0o666)
    server.listen(64)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_record, args=(conn,), daemon=True).start()


def _fallback(kind: str) -> int:
    if kind == "session":
        os.makedirs(FALLBACK_TERMINAL_DIR, exist_ok=True)
        path = f"{FALLBACK_TERMINAL_DIR}/{_stamp()}-{os.getpid()}.typescript"
    else:
        path = FALLBACK_HISTORY_FILE
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def send(kind: str, fifo: str | None) -> None:
    """As the participant: copy the input to the recorder (or the fallback file) until EOF."""
    source = os.open(fifo, os.O_RDONLY) if fifo else 0
    if fifo:
        os.unlink(fifo)
    tag = next(t for t, k in KINDS.items() if k == kind)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(SOCKET_PATH)
        conn.sendall(tag)
        sink = None
    except OSError:
        conn.close()
        sink = _fallback(kind)
    while chunk := os.read(source, CHUNK):
        if sink is None:
            try:
                conn.sendall(chunk)
                continue
            except OSError:  # the recorder went away: the rest goes to the fallback file
                sink = _fallback(kind)
        _write_all(sink, chunk)


def ping() -> bool:
    """Whether a recorder answers on the socket (how it is found running: no pid file to trust)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(SOCKET_PATH)
        except OSError:
            return False
    return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve()
        return 0
    if argv[:1] == ["ping"]:
        return 0 if ping() else 1
    if len(argv) in (2, 3) and argv[0] == "send" and argv[1] in KINDS.values():
        for number in (signal.SIGHUP, signal.SIGINT):  # the shell's end is not the recording's
            signal.signal(number, signal.SIG_IGN)
        send(argv[1], argv[2] if len(argv) == 3 else None)
        return 0
    print("usage: serve | ping | send session|history [FIFO]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
