"""The in-container terminal recorder's protocol, run here on temporary paths (no Docker; the
container path, where the participant cannot write the records, is tests/app/
test_terminal_recording.py): the recorder names each session's file itself and only appends,
an unknown kind records nothing, a sender whose recorder does not answer keeps its bytes in
the fallback file, and a recording that ends while its shell runs on is flagged (decided on real
processes of this machine; in the workspace container: test_terminal_records_gaps.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from baseline.workspaces import terminal_recorder as recorder


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "log"
    monkeypatch.setattr(recorder, "SOCKET_PATH", str(tmp_path / "rec.sock"))
    monkeypatch.setattr(recorder, "RECORD_ROOT", str(root))
    monkeypatch.setattr(recorder, "TERMINAL_DIR", str(root / "terminal"))
    monkeypatch.setattr(recorder, "HISTORY_FILE", str(root / "shell_history"))
    monkeypatch.setattr(recorder, "GAPS_FILE", str(root / "gaps"))
    monkeypatch.setattr(recorder, "FALLBACK_TERMINAL_DIR", str(tmp_path / "fallback"))
    monkeypatch.setattr(recorder, "FALLBACK_HISTORY_FILE", str(tmp_path / "fallback_history"))
    return tmp_path


def _connect(tag: bytes, payload: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(recorder.SOCKET_PATH)
        conn.sendall(tag + payload)


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_recorder_names_and_appends(paths: Path) -> None:
    threading.Thread(target=recorder.serve, daemon=True).start()
    _until(recorder.ping, "the recorder never answered")
    history = Path(recorder.HISTORY_FILE)
    _connect(b"h", b"#1\nls\n")
    _connect(b"h", b"#2\ncat notes\n")
    _connect(b"s", b"$ echo hi\r\nhi\r\n")
    _connect(b"x", b"not a kind")
    sessions = Path(recorder.TERMINAL_DIR)
    _until(lambda: history.exists() and history.read_bytes().count(b"#") == 2, "history")
    _until(lambda: any(sessions.iterdir()), "the session file")
    assert history.read_bytes() in (b"#1\nls\n#2\ncat notes\n", b"#2\ncat notes\n#1\nls\n")
    (session,) = sessions.iterdir()
    # Named by the recorder: the time and the sender's pid (here this process), never by it.
    assert session.name.endswith(f"-{os.getpid()}.typescript")
    _until(lambda: session.read_bytes() == b"$ echo hi\r\nhi\r\n", "the session's bytes")
    assert oct(session.stat().st_mode & 0o777) == "0o644"
    # (and, later, `gaps`: this process's parent, whose history these "senders" were, runs on)
    assert {p.name for p in Path(recorder.RECORD_ROOT).iterdir()} - {"gaps"} == {
        "shell_history",
        "terminal",
    }


def test_a_sender_without_recorder_keeps_its_bytes_in_the_fallback(paths: Path) -> None:
    fifo = paths / "typescript.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as out:
            out.write(b"$ make\r\n")

    writer = threading.Thread(target=write)
    writer.start()
    recorder.send("session", str(fifo))
    writer.join()
    assert not fifo.exists()  # removed once open
    (kept,) = Path(recorder.FALLBACK_TERMINAL_DIR).iterdir()
    assert kept.read_bytes() == b"$ make\r\n"
    assert recorder.main(["send", "nonsense"]) == 2


def _sleeper(*argv0: str) -> subprocess.Popen[bytes]:
    """A process that lives until killed, named `argv0` (its command line's first words)."""
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    if not argv0:
        return subprocess.Popen(sleep)
    named = subprocess.Popen(["bash", "-c", 'exec -a "$0" "$@"', *argv0[:1], *sleep, *argv0[1:]])
    cmdline = Path(f"/proc/{named.pid}/cmdline")
    _until(lambda: cmdline.read_bytes().startswith(argv0[0].encode() + b"\0"), "its exec")
    return named


def test_the_gap_decision_on_real_processes() -> None:
    shell = _sleeper()
    try:
        watched = recorder.identity(shell.pid)
        assert watched is not None and watched[0] == shell.pid
        # Alive and the same process through the grace: an interruption.
        assert recorder.interrupted(watched, 0.2)
        # The same pid under another start time is another process (pids are reused): none.
        assert not recorder.interrupted((shell.pid, watched[1] + 1), 0.2)
        shell.kill()
        # Dead but not yet reaped (a zombie) is gone, as after reaping: none, at once.
        _until(lambda: recorder.identity(shell.pid) is None, "the zombie")
        started = time.monotonic()
        assert not recorder.interrupted(watched, 5)
        assert time.monotonic() - started < 1
    finally:
        shell.kill()
        shell.wait()
    assert not recorder.interrupted(watched, 0.2)
    # A shell that exits during the grace is a normal end.
    exiting = subprocess.Popen(["sleep", "0.3"])
    exiting_id = recorder.identity(exiting.pid)
    assert exiting_id is not None
    reaper = threading.Thread(target=exiting.wait)
    reaper.start()
    assert not recorder.interrupted(exiting_id, 10)
    reaper.join()


def test_what_each_sender_records_is_found_from_proc(tmp_path: Path) -> None:
    fifo = str(tmp_path / ".baseline-typescript.abc")
    script = _sleeper("script", "-q", "-f", fifo)
    other = _sleeper("script", "-q", "-f", fifo + "x")
    session_sender = _sleeper("python3", "/etc/baseline-recorder.py", "send", "session", fifo)
    # A history sender is bash's child (process substitution): here a child of a real bash.
    bash = subprocess.Popen(["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(60)'; :"])
    try:
        assert recorder.watched_for(session_sender.pid, "session") == recorder.identity(script.pid)
        assert recorder.watched_for(script.pid, "session") is None  # no FIFO named: nothing
        _until(lambda: bool(_python_children(bash.pid)), "the history sender")
        (history_sender,) = _python_children(bash.pid)
        assert recorder.watched_for(history_sender, "history") == recorder.identity(bash.pid)
        # A sender whose parent is not a bash (its shell was gone: it went to init) watches none.
        assert recorder.watched_for(script.pid, "history") is None
    finally:
        for process in (script, other, session_sender, bash):
            process.kill()
            process.wait()


def _python_children(pid: int) -> list[int]:
    """The children of `pid` that run Python now (not a bash forked but not yet exec'd)."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(OSError):  # gone meanwhile
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if argv[0] == sys.executable.encode():
                found.append(int(child))
    return found


def _bash_with_history_sender(then: str) -> subprocess.Popen[bytes]:
    """A bash that sends its history as the snippet's does (a process substitution reading
    fd 9), writes one command to it, then runs `then`."""
    sender = (
        f"import socket,sys; c=socket.socket(socket.AF_UNIX); c.connect({recorder.SOCKET_PATH!r});"
        " c.sendall(b'h'); [c.sendall(line) for line in sys.stdin.buffer]"
    )
    script = f'exec 9> >(exec "$0" -c "$1"); echo "#1 make" >&9; {then}'
    return subprocess.Popen(["bash", "-c", script, sys.executable, sender])


def test_a_recording_ended_while_its_shell_runs_is_flagged(
    paths: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder, "GRACE_S", 0.3)
    threading.Thread(target=recorder.serve, daemon=True).start()
    _until(recorder.ping, "the recorder never answered")
    gaps = Path(recorder.GAPS_FILE)
    history = Path(recorder.HISTORY_FILE)
    recorded = lambda: history.exists() and history.read_bytes().count(b"make")  # noqa: E731
    # A shell that exits once its command is on record: the sender's end is the shell's.
    ending = _bash_with_history_sender(f"until grep -q make {history}; do sleep 0.02; done")
    assert ending.wait(timeout=30) == 0
    _until(lambda: recorded() == 1, "the first shell's command")
    # A shell that runs on while its sender is killed: flagged, after the grace.
    running = _bash_with_history_sender("sleep 60; :")  # (`; :`: bash stays, not exec'd)
    try:
        _until(lambda: recorded() == 2, "the second shell's command")
        (sender,) = _python_children(running.pid)
        os.kill(sender, 9)
        _until(lambda: gaps.exists() and gaps.read_bytes().endswith(b"\n"), "the flag")
        (line,) = gaps.read_bytes().splitlines()  # the first shell's normal end left none
        flag = json.loads(line)
        assert flag["kind"] == "history" and flag["file"] == str(history)
        assert (flag["sender_pid"], flag["shell_pid"]) == (sender, running.pid)
        assert oct(gaps.stat().st_mode & 0o777) == "0o644"
    finally:
        running.kill()
        running.wait()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failing_gap_check_never_stops_the_recording(
    paths: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise OSError("no /proc here")

    threading.Thread(target=recorder.serve, daemon=True).start()
    _until(recorder.ping, "the recorder never answered")
    history = Path(recorder.HISTORY_FILE)
    monkeypatch.setattr(recorder, "watched_for", broken)
    _connect(b"h", b"#1\nls\n")
    _until(lambda: history.exists() and history.read_bytes() == b"#1\nls\n", "the first")
    monkeypatch.setattr(recorder, "watched_for", lambda pid, kind: (pid, 0))
    monkeypatch.setattr(recorder, "interrupted", broken)
    _connect(b"h", b"#2\npwd\n")
    _connect(b"h", b"#3\nid\n")
    _until(lambda: history.read_bytes().count(b"#") == 3, "the later connections")
    assert recorder.ping() and not Path(recorder.GAPS_FILE).exists()
