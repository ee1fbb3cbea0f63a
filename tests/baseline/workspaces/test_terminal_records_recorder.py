"""The in-container terminal recorder's protocol, run here on temporary paths (no Docker; the
container path, where the participant cannot write the records, is tests/app/
test_terminal_recording.py): the recorder names each session's file itself and only appends,
an unknown kind records nothing, and a sender whose recorder does not answer keeps its bytes in
the fallback file."""

from __future__ import annotations

import os
import socket
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
    assert sorted(p.name for p in Path(recorder.RECORD_ROOT).iterdir()) == [
        "shell_history",
        "terminal",
    ]


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
