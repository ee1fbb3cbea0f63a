"""The shell snippet's history sender survives a shell that ends at once (no Docker).

A participant who types a command and `exit` before the shell's history sender has started
(a loaded machine schedules the forked sender late) must still have the command on record: the
terminal's hang-up, sent to the shell's process group when the shell ends, must not reach a
sender still starting. Here the snippet and the recorder run on temporary paths in a real
interactive bash on a pseudo-terminal (`script`), with a `setsid` that starts one second late.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from baseline.workspaces import terminal_recorder, terminal_records

pytestmark = pytest.mark.skipif(
    not (shutil.which("script") and shutil.which("setsid") and shutil.which("bash")),
    reason="needs util-linux script and setsid and bash",
)


def _on_temporary_paths(text: str, tmp_path: Path) -> str:
    for container_path, name in (
        (terminal_records.RECORDER_PATH, "recorder.py"),
        (terminal_recorder.SOCKET_PATH, "recorder.sock"),
        (terminal_recorder.RECORD_ROOT, "records"),
        ("/home/logs", "fallback"),
    ):
        text = text.replace(container_path, str(tmp_path / name))
    return text


def test_a_command_typed_just_before_exit_reaches_the_recorder(tmp_path: Path) -> None:
    recorder = tmp_path / "recorder.py"
    recorder.write_text(_on_temporary_paths(Path(terminal_recorder.__file__).read_text(), tmp_path))
    snippet = tmp_path / "snippet.sh"
    snippet.write_text(_on_temporary_paths(terminal_records.RECORD_SNIPPET, tmp_path))
    late = tmp_path / "bin"
    late.mkdir()
    (late / "setsid").write_text(f'#!/bin/sh\nsleep 1\nexec {shutil.which("setsid")} "$@"\n')
    (late / "setsid").chmod(0o755)
    serving = subprocess.Popen(["python3", str(recorder), "serve"])
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["python3", str(recorder), "ping"], check=False).returncode:
            assert time.monotonic() < deadline, "the recorder did not start"
            time.sleep(0.05)
        # Inside the session wrapper already (BASELINE_RECORDING): only the history part runs.
        env = {**os.environ, "PATH": f"{late}:{os.environ['PATH']}", "BASELINE_RECORDING": "1"}
        typed = subprocess.run(
            ["script", "-q", "-c", f"bash --noprofile --rcfile {snippet} -i", "/dev/null"],
            input=b"echo recorded-$((6*7))\nexit\n",
            env=env, capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert typed.returncode == 0, typed.stderr
        history = tmp_path / "records" / "shell_history"
        deadline = time.monotonic() + 10
        while not (history.exists() and b"echo recorded-$((6*7))" in history.read_bytes()):
            assert time.monotonic() < deadline, "the command never reached the recorder"
            time.sleep(0.1)
        fallback = tmp_path / "fallback" / "shell_history"
        assert not fallback.exists() or b"recorded" not in fallback.read_bytes()
    finally:
        serving.kill()
        serving.wait()
