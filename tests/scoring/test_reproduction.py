"""Reproduction in a real Docker workspace: log, exit code, time-out, files, git status, salvage.

Uses the workspace test image that scripts/services/20-docker.sh builds (BASELINE_TEST_IMAGE);
without a Docker Engine the tests fail under BASELINE_REQUIRE_SERVICES=1 and skip otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import docker
import pytest

from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.hardware import get_profile
from infra.snapshots import capture_directory, load_manifest
from infra.workspace import WorkspaceHandle, WorkspaceSpec
from scoring import reproduction
from scoring.failure import FailureClass
from scoring.reproduction import (
    ReproductionOptions,
    SalvageSetting,
    reproduce,
    reproduce_in_workspace,
)
from tests.docker_env import TEST_LABELS, docker_url, test_image

__all__ = ["test_image"]  # a fixture used by the tests below

pytestmark = pytest.mark.docker

RESULTS_SCRIPT = """#!/usr/bin/env bash
set -euo pipefail
echo "starting as $(id -un)"
mkdir -p results
python3 -c "print('accuracy,0.97')" > results/metrics.csv
echo "changed" > notes.txt
echo done
"""


def _snapshot(root: Path, store: BlobStore, files: dict[str, str], git: bool = False) -> str:
    root.mkdir(parents=True)
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if git:
        env = {"GIT_AUTHOR_NAME": "p", "GIT_AUTHOR_EMAIL": "p@x", "GIT_COMMITTER_NAME": "p",
               "GIT_COMMITTER_EMAIL": "p@x", "PATH": "/usr/bin:/bin"}  # fmt: skip
        subprocess.run(["git", "init", "-q", "."], cwd=root, check=True, env=env)
        subprocess.run(["git", "add", "-A"], cwd=root, check=True, env=env)
        subprocess.run(["git", "commit", "-qm", "work"], cwd=root, check=True, env=env)
    return capture_directory(root, store).manifest_sha256


@pytest.fixture(scope="module")
def backend() -> Iterator[DockerBackend]:
    instance = DockerBackend.from_url(docker_url("unix"), labels=TEST_LABELS)
    yield instance
    instance.close()


def _spec(image: str) -> WorkspaceSpec:
    return WorkspaceSpec(
        name=f"bl-test-repro-{uuid.uuid4().hex[:10]}",
        image=image,
        profile=get_profile("cpu")[0],
        labels={"baseline.purpose": "reproduction"},
    )


@pytest.fixture(scope="module")
def workspace(backend: DockerBackend, test_image: str) -> Iterator[WorkspaceHandle]:
    """One fresh workspace shared by the scenarios that do not test creation itself."""
    with _started(backend, _spec(test_image)) as handle:
        yield handle


def test_reproduction_in_a_fresh_workspace(
    backend: DockerBackend, test_image: str, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    files = {
        "reproduce.sh": RESULTS_SCRIPT,
        "train.py": "print('train')\n",
        "notes.txt": "original\n",
        "venv/bin/python3": "a broken link to the participant's python\n",
    }
    digest = _snapshot(tmp_path / "sub", store, files, git=True)
    streamed: list[bytes] = []
    spec = _spec(test_image)
    result = reproduce(
        backend, spec, store, digest, ReproductionOptions(timeout_s=120), streamed.append
    )

    assert result.reproduce_sh_present and result.exit_code == 0 and not result.timed_out
    assert result.failure_class is None and result.succeeded
    log = store.get_bytes(result.log_sha256).decode()
    assert "starting as participant" in log and "done" in log
    assert b"".join(streamed).decode() == log  # streamed as it ran, and kept whole
    assert 0 < result.duration_s < 120
    assert result.added == ["results", "results/metrics.csv"]
    assert result.changed == ["notes.txt"]
    assert "venv/bin/python3" not in {f.path for f in result.files_before}
    before = {f.path: f.sha256 for f in result.files_before}
    after = {f.path: f.sha256 for f in result.files_after}
    assert after["train.py"] == before["train.py"]  # the same blob: storage is shared
    assert store.get_bytes(after["results/metrics.csv"]) == b"accuracy,0.97\n"
    assert " M notes.txt" in result.git_status and "?? results/metrics.csv" in result.git_status
    executed = load_manifest(store, result.executed_manifest_sha256)
    assert {e.path for e in executed.files} >= {"results/metrics.csv", "reproduce.sh", ".git/HEAD"}
    assert not result.salvage_used and len(result.attempts) == 1
    # The workspace was destroyed: no container and no volume remain.
    client = docker.DockerClient(base_url=docker_url("unix"))
    try:
        assert client.containers.list(all=True, filters={"name": spec.name}) == []
        assert client.volumes.list(filters={"name": f"{spec.name}-submission"}) == []
    finally:
        client.close()


def test_time_limit_kills_the_run(
    backend: DockerBackend, workspace: WorkspaceHandle, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    digest = _snapshot(
        tmp_path / "sub",
        store,
        {"reproduce.sh": "echo before\nsleep 60\necho after > late.txt\n"},
    )
    result = reproduce_in_workspace(
        backend, workspace, store, digest, ReproductionOptions(timeout_s=2)
    )
    assert result.timed_out and result.exit_code is None
    assert result.failure_class == FailureClass.TIMEOUT.value
    assert 2 <= result.duration_s < 30
    assert "late.txt" not in {f.path for f in result.files_after}
    assert "before" in store.get_bytes(result.log_sha256).decode()


# Started by reproduce.sh in a session of its own (out of the script's process group, as
# `timeout` signals it): writes a file named by its elapsed milliseconds every 20 ms.
WRITER = r"""
import os, sys, time
start = float(sys.argv[1])
os.makedirs("ticks", exist_ok=True)
while True:
    open(f"ticks/{int((time.time() - start) * 1000):06d}", "w").close()
    time.sleep(0.02)
"""


@contextlib.contextmanager
def _started(backend: DockerBackend, spec: WorkspaceSpec) -> Iterator[WorkspaceHandle]:
    """A workspace of its own for a scenario that changes it for good; destroyed after."""
    handle = backend.create(spec)
    try:
        backend.start(handle)
        yield handle
    finally:
        backend.destroy(handle)


def _processes(backend: DockerBackend, workspace: WorkspaceHandle) -> list[str]:
    listed = backend.exec(workspace, ["ps", "-eo", "args="], user="0", timeout_s=30)
    return [line for line in listed.output.decode().splitlines() if line.strip()]


def test_nothing_written_after_the_limit_is_credited_and_nothing_outlives_it(
    backend: DockerBackend,
    workspace: WorkspaceHandle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loaded machine's clock between the run's start and its guard's (a millisecond a
    # reading here): the first run still has the whole limit, not "2.99995 s" (a CI failure).
    readings = itertools.count()
    monkeypatch.setattr(
        reproduction,
        "time",
        SimpleNamespace(monotonic=lambda: time.monotonic() + next(readings) / 1000),
    )
    store = BlobStore(tmp_path / "blobs")
    script = (
        "start=$(date +%s.%N)\n"
        'setsid python3 writer.py "$start" > /dev/null 2>&1 < /dev/null &\n'
        "sleep 60\n"
    )
    digest = _snapshot(tmp_path / "sub", store, {"reproduce.sh": script, "writer.py": WRITER})
    result = reproduce_in_workspace(
        backend, workspace, store, digest, ReproductionOptions(timeout_s=3)
    )
    assert result.timed_out and result.failure_class == FailureClass.TIMEOUT.value
    ticks = sorted(int(f.path.split("/")[-1]) for f in result.files_after if "ticks/" in f.path)
    assert len(ticks) > 20  # it ran most of the 3 s
    assert ticks[-1] < 3000, f"a file written at {ticks[-1]} ms of a 3000 ms limit was kept"
    assert result.stray_processes >= 1  # the writer (and the script's sleep)
    assert not any(
        "writer.py" in line or "sleep 60" in line for line in _processes(backend, workspace)
    )
    log = store.get_bytes(result.log_sha256).decode()
    assert "the time limit (3 s) was reached" in log and "stopped and killed" in log


def test_files_written_while_the_guard_waits_to_be_scheduled_are_not_credited(
    backend: DockerBackend, workspace: WorkspaceHandle, tmp_path: Path
) -> None:
    """A busy machine schedules the guard late after the limit: here the run itself holds the
    guard stopped from 2.5 s to 3.6 s of a 3 s limit, so the writer goes on past the limit."""
    store = BlobStore(tmp_path / "blobs")
    script = (
        "start=$(date +%s.%N)\n"
        "guard=$(ps -o ppid= -p $PPID | tr -d ' ')\n"
        'setsid python3 writer.py "$start" > /dev/null 2>&1 < /dev/null &\n'
        'setsid sh -c "sleep 2.5; kill -STOP $guard; sleep 1.1; kill -CONT $guard" '
        "> /dev/null 2>&1 < /dev/null &\n"
        "sleep 60\n"
    )
    digest = _snapshot(tmp_path / "sub", store, {"reproduce.sh": script, "writer.py": WRITER})
    result = reproduce_in_workspace(
        backend, workspace, store, digest, ReproductionOptions(timeout_s=3)
    )
    assert result.timed_out
    ticks = sorted(int(f.path.split("/")[-1]) for f in result.files_after if "ticks/" in f.path)
    assert len(ticks) > 20 and ticks[-1] < 3000, ticks[-5:]
    log = store.get_bytes(result.log_sha256).decode()
    assert "written after the limit, before every process was stopped, were removed" in log


def test_processes_a_finished_script_left_running_are_killed_before_the_capture(
    backend: DockerBackend, workspace: WorkspaceHandle, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    script = "setsid sh -c 'sleep 2; echo late > late.txt' > /dev/null 2>&1 &\necho ok\n"
    digest = _snapshot(tmp_path / "sub", store, {"reproduce.sh": script})
    result = reproduce_in_workspace(
        backend, workspace, store, digest, ReproductionOptions(timeout_s=60)
    )
    assert result.exit_code == 0 and result.succeeded  # leaving processes is not a failure
    assert result.stray_processes >= 1
    time.sleep(2.5)  # had the writer survived, it would have written by now
    assert "late.txt" not in {f.path for f in result.files_after}
    assert not any("sleep 2" in line for line in _processes(backend, workspace))
    listed = backend.exec(workspace, ["ls", "/home/submission"], timeout_s=30)
    assert b"late.txt" not in listed.output
    log = store.get_bytes(result.log_sha256).decode()
    assert "reproduce.sh ended leaving" in log


def test_a_fork_bomb_is_a_recorded_failure_and_is_killed(
    backend: DockerBackend, test_image: str, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    script = "bomb() { bomb | bomb & }\nbomb\nsleep 2\necho survived\nexit 0\n"
    digest = _snapshot(tmp_path / "sub", store, {"reproduce.sh": script})
    spec = dataclasses.replace(
        _spec(test_image), profile=dataclasses.replace(get_profile("cpu")[0], pids=128)
    )
    with _started(backend, spec) as handle:
        result = reproduce_in_workspace(
            backend, handle, store, digest, ReproductionOptions(timeout_s=60)
        )
        # The script's own status depends on the machine: 0 when `sleep` found a free process
        # slot, 254 when bash gave up forking it (CI, under load); a failure either way (an exit
        # 0 at the limit is a failure too: tests/scoring/test_failure.py).
        assert result.exit_code is not None and result.process_limit_reached
        assert not result.succeeded
        assert result.failure_class == FailureClass.SCRIPT_ERROR.value
        assert result.failure_rule == "process-limit"
        assert result.stray_processes > 10
        assert not any("bash" in line for line in _processes(backend, handle))


def test_a_run_that_kills_its_guard_fails_and_leaves_nothing_running(
    backend: DockerBackend, test_image: str, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    script = (
        "setsid sh -c 'while :; do date +%s%N > alive; sleep 0.05; done' > /dev/null 2>&1 &\n"
        "kill -9 $(ps -o ppid= -p $PPID)\nsleep 1\nexit 0\n"  # the guard: the parent's parent
    )
    digest = _snapshot(tmp_path / "sub", store, {"reproduce.sh": script})
    with _started(backend, _spec(test_image)) as handle:
        result = reproduce_in_workspace(
            backend, handle, store, digest, ReproductionOptions(timeout_s=60)
        )
        assert not result.succeeded and result.exit_code == 137
        log = store.get_bytes(result.log_sha256).decode()
        assert "the guard of reproduce.sh was killed (exit 137)" in log
        assert not any("sleep 0.05" in line for line in _processes(backend, handle))
        alive = backend.exec(handle, ["cat", "/home/submission/alive"], timeout_s=30).output
        time.sleep(0.5)
        assert backend.exec(handle, ["cat", "/home/submission/alive"], timeout_s=30).output == alive


def test_missing_reproduce_sh(
    backend: DockerBackend, workspace: WorkspaceHandle, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    digest = _snapshot(tmp_path / "sub", store, {"README.md": "no script\n"})
    result = reproduce_in_workspace(
        backend, workspace, store, digest, ReproductionOptions(timeout_s=30)
    )
    assert not result.reproduce_sh_present and result.exit_code is None
    assert result.failure_class == FailureClass.MISSING_REPRODUCE_SH.value
    assert result.attempts == []
    # The previous scenario's files were removed by the restore: the workspace starts clean.
    assert {f.path for f in result.files_after} == {"README.md"}


def test_log_is_capped_keeping_head_and_tail(
    backend: DockerBackend, workspace: WorkspaceHandle, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    script = (
        "echo FIRST-LINE\n"
        "python3 -c \"print('x' * 199, flush=True)\" | head -c 0\n"
        'for i in $(seq 1 2000); do echo "line $i padded to be long enough to matter"; done\n'
        "python3 -c 'import json; json.loads(\"{\")'\n"
    )
    digest = _snapshot(tmp_path / "sub", store, {"reproduce.sh": script})
    options = ReproductionOptions(timeout_s=60, log_head_bytes=100, log_tail_bytes=2048)
    result = reproduce_in_workspace(backend, workspace, store, digest, options)
    log = store.get_bytes(result.log_sha256).decode()
    assert result.log_truncated and result.log_bytes_total > 50_000
    assert log.startswith("FIRST-LINE") and "bytes of reproduce.log omitted" in log
    assert "JSONDecodeError" in log and len(log) < 2048 + 100 + 100
    assert result.exit_code == 1
    assert result.failure_class == FailureClass.SCRIPT_ERROR.value
    assert "JSONDecodeError" in (result.failure_evidence or "")


def test_salvage_retries_are_off_by_default_and_recorded_when_on(
    backend: DockerBackend, workspace: WorkspaceHandle, tmp_path: Path
) -> None:
    store = BlobStore(tmp_path / "blobs")
    # Fails unless run inside a virtual environment: what a fresh venv salvages.
    script = (
        'python3 -c "import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 7)"\n'
        "echo salvaged > ok.txt\n"
    )
    digest = _snapshot(tmp_path / "sub", store, {"reproduce.sh": "set -e\n" + script})
    plain = reproduce_in_workspace(
        backend, workspace, store, digest, ReproductionOptions(timeout_s=60)
    )
    assert plain.exit_code == 7 and not plain.salvage_used and len(plain.attempts) == 1

    options = ReproductionOptions(
        timeout_s=120,
        salvage=True,
        salvage_settings=(SalvageSetting(python="python9.9"), SalvageSetting(make_venv=True)),
    )
    salvaged = reproduce_in_workspace(backend, workspace, store, digest, options)
    assert salvaged.salvage_used and salvaged.exit_code == 0 and salvaged.failure_class is None
    assert [a.skipped is not None for a in salvaged.attempts] == [False, True, False]
    assert salvaged.attempts[0].exit_code == 7
    assert "python9.9" in (salvaged.attempts[1].skipped or "")
    assert salvaged.attempts[2].setting.make_venv and salvaged.attempts[2].exit_code == 0
    assert "ok.txt" in salvaged.added
    # The venv the salvage made is not part of the executed snapshot.
    assert not any(f.path.startswith("venv/") for f in salvaged.files_after)


def test_git_status_runs_nothing_of_the_participant_and_stays_in_the_limit(
    backend: DockerBackend, workspace: WorkspaceHandle, tmp_path: Path
) -> None:
    """The submission's git config asks git to run programs (fsmonitor, a clean filter) that
    write files after a delay: none may run, nothing may be credited, no time is added."""
    store = BlobStore(tmp_path / "blobs")
    root = tmp_path / "sub"
    digest = _snapshot(root, store, {"reproduce.sh": "echo ran\n", "data.txt": "x\n"}, git=True)
    (root / ".gitattributes").write_text("*.txt filter=evil\n")
    git = ["git", "-C", str(root), "config"]
    subprocess.run([*git, "core.fsmonitor", "sleep 20; echo x > late.txt; echo"], check=True)
    subprocess.run([*git, "filter.evil.clean", "sleep 20; echo y > late-filter.txt; cat"],
                   check=True)  # fmt: skip
    digest = capture_directory(root, store).manifest_sha256
    started = time.monotonic()
    result = reproduce_in_workspace(
        backend, workspace, store, digest, ReproductionOptions(timeout_s=10)
    )
    elapsed = time.monotonic() - started
    produced = set(result.added) | {f.path for f in result.files_after}
    assert "late.txt" not in produced and "late-filter.txt" not in produced
    assert result.exit_code == 0
    assert "?? .gitattributes" in result.git_status
    assert elapsed < 20, elapsed
    # nothing was started in the background that writes later either
    check = backend.exec(workspace, ["sh", "-c", "sleep 1; ls /home/submission"], timeout_s=30)
    assert b"late" not in check.output
