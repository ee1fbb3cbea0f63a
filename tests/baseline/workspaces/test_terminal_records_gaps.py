"""Killing a shell's senders in a real workspace container leaves a flag; an exit leaves none.

The participant can kill the `send` processes that carry their shell's session and history to
the root recorder: the shell goes on, unrecorded. The recorder notices the connection end while
the shell still runs and appends to its root-owned gaps file, which the participant cannot
remove and collection brings back. The container is the workspace image with the recorder
placed as at an attempt container's creation (`place_in_workspace`); the shells are login
shells on a pseudo-terminal (`script`), as JupyterLab's terminals are, driven by `docker exec`.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import pytest

from baseline.models import TerminalRecording, Workspace, WorkspacePurpose
from baseline.workspaces import terminal_records
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceHandle
from tests.docker_env import TEST_LABELS, docker_url, new_name, test_image

pytestmark = [pytest.mark.docker]
__all__ = ["test_image"]

SHELL = ["timeout", "30", "script", "-q", "-c", "sh -l", "/dev/null"]


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.sqlite_only("terminal recording inside a workspace container")
def test_killing_the_senders_of_a_live_shell_is_flagged_an_exit_is_not(test_image: str) -> None:
    backend = DockerBackend.from_url(docker_url("unix"), labels=TEST_LABELS)
    container = backend.client.containers.run(
        test_image, ["sleep", "300"], name=new_name("bl-test-rec"), labels=TEST_LABELS,
        detach=True, init=True, security_opt=["no-new-privileges"],
    )  # fmt: skip
    name = str(container.name)

    def run(*argv: str) -> bytes:
        """What a command run as the participant printed; nothing when it failed."""
        done = subprocess.run(["docker", "exec", "-u", "participant", name, *argv],
                              capture_output=True, timeout=60, check=False)  # fmt: skip
        return done.stdout if done.returncode == 0 else b""

    def history() -> bytes:
        return run("cat", terminal_records.HISTORY_FILE)

    try:
        handle = WorkspaceHandle(name, "docker", str(container.id), None, "")
        workspace = Workspace(purpose=WorkspacePurpose.ATTEMPT)
        assert terminal_records.place_in_workspace(workspace, backend, handle)
        # A shell that exits: its senders end with it, normally.
        typed = subprocess.run(
            ["docker", "exec", "-i", "-u", "participant", name, *SHELL],
            input=b"echo normal-$((6*7))\nexit\n", capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert typed.returncode == 0, typed.stderr
        _until(lambda: b"echo normal-$((6*7))" in history(), "the first shell's history")
        _until(lambda: not run("pgrep", "-f", "baseline-recorder.py send"), "its senders' end")
        (first,) = run("ls", terminal_records.RECORD_DIR).split()
        # A shell whose senders are killed while it runs on.
        shell = subprocess.Popen(
            ["docker", "exec", "-i", "-u", "participant", name, *SHELL],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert shell.stdin is not None
        try:
            shell.stdin.write(b"echo running-$((6*7))\n")
            shell.stdin.flush()
            _until(lambda: b"echo running-$((6*7))" in history(), "the second shell's history")
            # (each recording's file is made once its sender is connected and watched)
            _until(lambda: len(run("ls", terminal_records.RECORD_DIR).split()) == 2, "its file")
            senders = run("pgrep", "-f", "baseline-recorder.py send").split()
            assert len(senders) == 2
            run("kill", "-9", *(pid.decode() for pid in senders))
            _until(lambda: run("cat", terminal_records.GAPS_FILE).count(b"\n") == 2, "the flags")
            # The shell itself runs on (unrecorded now) and exits normally.
            shell.stdin.write(b"echo unrecorded\nexit\n")
            shell.stdin.close()
            assert shell.wait(timeout=30) == 0
        finally:
            shell.kill()
            shell.wait()
        # Two flags, the killed senders': the first shell's exit (its grace over before theirs)
        # and the second's, whose senders were gone, left none.
        lines = run("cat", terminal_records.GAPS_FILE).splitlines()
        flags = {flag["kind"]: flag for flag in map(json.loads, lines)}
        assert len(lines) == 2 and sorted(flags) == ["history", "session"]
        assert flags["history"]["file"] == terminal_records.HISTORY_FILE
        session_file = flags["session"]["file"]
        # The killed shell's session, never the first shell's, which ended normally.
        assert session_file.startswith(terminal_records.RECORD_DIR + "/")
        assert session_file.endswith(f"-{flags['session']['sender_pid']}.typescript")
        assert first.decode() not in session_file
        assert {int(pid) for pid in senders} == {f["sender_pid"] for f in flags.values()}
        # The flag is root's: the participant can neither empty nor remove it.
        for attack in (f": > {terminal_records.GAPS_FILE}", f"rm -f {terminal_records.GAPS_FILE}"):
            assert not run("sh", "-c", f"{attack} && echo done"), attack
        # Collection brings it back with the recordings, read as two interruptions.
        collected = terminal_records.read_from(backend, handle)
        (gaps,) = [item for item in collected if item.kind == "gaps"]
        row = TerminalRecording(path=gaps.path, kind=gaps.kind, content=gaps.content)
        read = terminal_records.interruptions([row])
        assert sorted(i.gap.file for i in read if i.gap) == sorted(
            [session_file, terminal_records.HISTORY_FILE]
        )
    finally:
        container.remove(force=True)
        backend.close()
