"""The terminal recorder that runs inside an attempt's container (standard library only).

A record the participant could edit is no record: a file written by the participant's own
process (``script``, bash's ``history -a``) can be truncated by them. So the participant's
processes only *send*: ``serve`` runs as root (started by `terminal_records.start_recorder`),
listens on a Unix socket anyone in the container may connect to, and appends what each
connection sends to a file it alone opens for writing, under a root-owned directory the
participant can read but not write. A connection cannot name its file (the recorder names a
session after the time and the sender's pid), so nothing already recorded can be overwritten,
shortened or removed by the participant.

Killing a sender (or closing the shell's pipe to it) ends that recording while the shell goes on,
so that stretch of work would go unrecorded in silence. The recorder therefore notes at connect
which process writes what the sender sends (`watched_for`) and, when the connection ends while
that process still runs, the same process (pid and start time, as pids are reused) after a short
grace, appends a line to its own GAPS_FILE (`interrupted`, `_flag`): a shell that exits ends its
senders too, and that leaves nothing.

``send KIND [FIFO]`` runs as the participant: it copies its input (or the FIFO's, which it
removes once open) to the recorder. When the recorder does not answer it appends to the
fallback file under /home/logs instead, so a terminal never dies of its recording and nothing
is lost (those files are the participant's, checked for tampering at collection).

This file is copied into the container as it is (`terminal_records.place_in_workspace`), so it
imports nothing of Baseline.
"""

from __future__ import annotations

import contextlib
import json
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
# One JSON object a line: a recording that ended while what it recorded still ran.
GAPS_FILE = RECORD_ROOT + "/gaps"
# How long a shell whose sender's connection ended may take to be gone before that counts as a gap
# (a shell exiting closes the pipe a moment before it is gone, longer on a loaded machine).
GRACE_S = 2.0
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


Process = tuple[int, int]  # a pid and its start time (clock ticks after boot): one process


def _stat(pid: int) -> tuple[bytes, list[bytes]] | None:
    """The name of the process `pid` and the fields of its /proc/<pid>/stat from the state on,
    or None when there is no such process. Readable by anyone, unlike /proc/<pid>/fd, which
    root in a container without CAP_SYS_PTRACE cannot read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    name, _, fields = text[text.index(b"(") + 1 :].rpartition(b")")
    return name, fields.split()


def identity(pid: int) -> Process | None:
    """The process `pid` now (its start time is field 22), None when it is gone or a zombie."""
    stat = _stat(pid)
    if stat is None or stat[1][0] in (b"Z", b"X", b"x"):
        return None
    return pid, int(stat[1][19])


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().split(b"\0")[:-1]
    except OSError:
        return []


def watched_for(pid: int, kind: str) -> Process | None:
    """The process whose output the sender `pid` records, found by root from /proc, never from
    what the sender says. History: the sender's parent, the bash whose process substitution it
    is. Session: the `script` writing the FIFO named on the sender's command line; the sender
    cannot be `script`'s child (util-linux script spins waiting on a child it did not start), so
    it is found by its command line among the sender's user's processes."""
    if kind == "history":
        stat = _stat(pid)
        parent = _stat(int(stat[1][1])) if stat is not None else None
        # Not bash: the shell was gone before its sender started (it went to init).
        return identity(int(stat[1][1])) if stat and parent and parent[0] == b"bash" else None
    args = _cmdline(pid)
    if b"session" not in args[:-1]:
        return None
    fifo = args[args.index(b"session") + 1]
    uid = os.stat(f"/proc/{pid}").st_uid
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pid:
            continue
        other = _cmdline(int(entry))
        if other[-1:] == [fifo] and os.path.basename(other[0]) == b"script":
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    return identity(int(entry))
    return None


def interrupted(watched: Process, grace_s: float) -> bool:
    """Whether a recording that just ended left `watched` running: still the same process (not
    gone, not a zombie, not a new process under a reused pid) `grace_s` after the end, as a shell
    that is exiting is gone by then."""
    deadline = time.monotonic() + grace_s
    while identity(watched[0]) == watched:
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def _flag(gaps_file: str, line: dict[str, object]) -> None:
    fd = os.open(gaps_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _write_all(fd, json.dumps(line).encode() + b"\n")
    finally:
        os.close(fd)


def _record(conn: socket.socket) -> None:
    """One sender: its first byte says what it sends; the rest is appended to its file. A
    connection that ends while what it recorded still runs is noted in GAPS_FILE."""
    gaps_file, grace_s = GAPS_FILE, GRACE_S  # as they are now: the check runs after the end
    with conn:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        kind = KINDS.get(conn.recv(1))
        if kind is None:
            return
        try:
            watched = watched_for(pid, kind)
        except Exception:  # never let the check stop the recording
            watched = None
        path = f"{TERMINAL_DIR}/{_stamp()}-{pid}.typescript" if kind == "session" else HISTORY_FILE
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            with contextlib.suppress(ConnectionError):  # a killed sender may reset it
                while chunk := conn.recv(CHUNK):
                    _write_all(fd, chunk)
        finally:
            os.close(fd)
    ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with contextlib.suppress(Exception):  # a failed check or flag must not touch the recording
        if watched is not None and interrupted(watched, grace_s):
            _flag(gaps_file, {"at": ended, "kind": kind, "file": path,
                              "sender_pid": pid, "shell_pid": watched[0]})  # fmt: skip


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
