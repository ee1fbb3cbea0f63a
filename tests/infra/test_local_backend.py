"""The local sandbox backend on the real bubblewrap and cgroup v1 of this machine."""

from __future__ import annotations

import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.local_backend import LocalSandboxBackend
from infra.workspace import (
    HardwareProfile,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
    WorkspaceSpec,
    WorkspaceState,
)

CGROUPS = Path("/sys/fs/cgroup")
PROFILE = HardwareProfile(name="cpu-small", cpus=0.5, memory_mb=192, pids=40)


def unavailable(reason: str) -> None:
    if os.environ.get("BASELINE_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service missing: {reason}")
    pytest.skip(reason)


def sandbox_backend(root: Path, **options: Any) -> Iterator[LocalSandboxBackend]:
    """A backend under `root` with its own cgroup parent, removed afterwards."""
    if shutil.which("bwrap") is None:
        unavailable(
            "bubblewrap (bwrap) is not installed: scripts/services/25-egress.sh installs it"
        )
    parent = f"baseline-test-{uuid.uuid4().hex[:8]}"
    for controller in ("memory", "pids", "cpu"):
        try:
            (CGROUPS / controller / parent).mkdir()
        except OSError as exc:
            unavailable(f"cgroup v1 {controller} is not writable here: {exc}")
    backend = LocalSandboxBackend(root, cgroup_parent=parent, **options)
    try:
        yield backend
    finally:
        backend.reconcile(set(), min_age_s=0)
        for controller in ("memory", "pids", "cpu"):
            (CGROUPS / controller / parent).rmdir()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalSandboxBackend]:
    yield from sandbox_backend(tmp_path / "local")


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    task = tmp_path / "task"
    task.mkdir()
    (task / "paper.md").write_text("# The paper\n")
    return task


def make(backend: LocalSandboxBackend, task_dir: Path | None, **changes: object) -> WorkspaceHandle:
    spec = WorkspaceSpec(
        name=str(changes.pop("name", f"ws-{uuid.uuid4().hex[:8]}")),
        image="host",
        profile=PROFILE,
        task_dir=task_dir,
        **changes,  # type: ignore[arg-type]
    )
    handle = backend.create(spec)
    backend.start(handle)
    return handle


def run(backend: LocalSandboxBackend, handle: WorkspaceHandle, script: str, **kw: object):  # type: ignore[no-untyped-def]
    return backend.exec(handle, ["sh", "-c", script], **kw)  # type: ignore[arg-type]


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_implements_the_protocol(backend: LocalSandboxBackend) -> None:
    assert isinstance(backend, WorkspaceBackend)


def test_create_exec_copy_and_destroy(backend: LocalSandboxBackend, task_dir: Path) -> None:
    handle = make(backend, task_dir)
    assert backend.status(handle) is WorkspaceState.RUNNING
    result = run(backend, handle, "id -u; pwd; git rev-parse --is-inside-work-tree; ls /home/paper")
    assert result.exit_code == 0, result.output
    assert result.output.decode().split() == ["1000", "/home/submission", "true", "paper.md"]

    backend.put_archive(handle, "/home/submission", tar_of({"src/train.py": b"print('hi')\n"}))
    with tempfile.TemporaryFile() as streamed:  # a snapshot arrives as a file, read as a stream
        streamed.write(tar_of({"src/data.txt": b"42\n"}))
        streamed.seek(0)
        backend.put_archive(handle, "/home/submission", streamed)
    assert run(backend, handle, "cat src/data.txt").output == b"42\n"
    made = run(backend, handle, "python3 src/train.py > out.txt && echo log > /home/logs/a.log")
    assert made.exit_code == 0, made.output
    with tarfile.open(fileobj=io.BytesIO(backend.get_archive(handle, "/home/submission"))) as tar:
        names = set(tar.getnames())
        out = tar.extractfile("submission/out.txt")
        assert out is not None and out.read() == b"hi\n"
    assert {"submission/src/train.py", "submission/.git"} <= names
    assert b"a.log" in backend.get_archive(handle, "/home/logs/a.log")
    with pytest.raises(WorkspaceError, match="not in a place"):
        backend.put_archive(handle, "/usr", tar_of({"x": b""}))

    backend.destroy(handle)
    assert backend.status(handle) is WorkspaceState.MISSING
    assert not any(
        (CGROUPS / c / backend.cgroup_parent / handle.name).exists()
        for c in ("memory", "pids", "cpu")
    )
    assert not (backend.root / "submissions" / handle.submission_volume).exists()


def test_output_streams_while_the_command_runs(backend: LocalSandboxBackend) -> None:
    handle = make(backend, None)
    arrivals: list[tuple[float, bytes]] = []
    started = time.monotonic()
    result = run(
        backend,
        handle,
        "for i in 1 2 3; do echo line$i; sleep 0.4; done",
        on_output=lambda chunk: arrivals.append((time.monotonic() - started, chunk)),
    )
    assert result.exit_code == 0 and result.output == b"line1\nline2\nline3\n"
    assert b"".join(c for _, c in arrivals) == result.output
    assert arrivals[0][0] < result.duration_s - 0.5  # the first line came before the end


def test_timeout_kills_the_sandbox(backend: LocalSandboxBackend) -> None:
    handle = make(backend, None)
    result = run(backend, handle, "echo started; sleep 60 & sleep 60", timeout_s=1.5)
    assert result.timed_out and result.exit_code is None
    assert result.output == b"started\n"
    assert result.duration_s < 10
    procs = CGROUPS / "pids" / backend.cgroup_parent / handle.name / "cgroup.procs"
    deadline = time.monotonic() + 5
    while procs.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert procs.read_text().strip() == ""  # the background sleep died with the sandbox too


def test_output_is_truncated_at_the_limit(backend: LocalSandboxBackend) -> None:
    handle = make(backend, None)
    result = run(backend, handle, "head -c 5000 /dev/zero", max_output_bytes=1000)
    assert result.exit_code == 0 and result.truncated and len(result.output) == 1000


def test_paper_is_read_only_and_holds_only_the_task(
    backend: LocalSandboxBackend, task_dir: Path
) -> None:
    handle = make(backend, task_dir)
    result = run(backend, handle, "touch /home/paper/x; echo rc=$?; ls -A /home/paper")
    assert b"Read-only file system" in result.output and b"rc=1" in result.output
    assert result.output.decode().split()[-1] == "paper.md"
    assert not (task_dir / "x").exists()


def test_an_environment_under_tmp_is_shown_read_only(tmp_path: Path) -> None:
    """A Python environment in a checkout under /tmp (as in CI) stays visible inside, where
    the workspace's own /tmp is mounted too."""
    environment = tmp_path / "checkout" / ".venv"
    environment.mkdir(parents=True)
    (environment / "marker").write_text("the environment\n")
    assert str(environment).startswith("/tmp/")
    for backend in sandbox_backend(tmp_path / "local", ro_binds=(environment,)):
        handle = make(backend, None)
        script = f"cat {environment}/marker; touch {environment}/x; echo rc=$?"
        result = run(backend, handle, script)
        assert b"the environment" in result.output
        assert b"rc=1" in result.output and not (environment / "x").exists()
        result = run(backend, handle, "echo scratch > /tmp/own && cat /tmp/own")
        assert result.output.strip() == b"scratch"  # the workspace's own /tmp still works


def test_none_network_has_no_route_out(backend: LocalSandboxBackend) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        accepted: list[object] = []
        server.settimeout(3)
        waiter = threading.Thread(target=lambda: _accept(server, accepted))
        waiter.start()
        probe = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), 2); print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', e)\n"
        )
        isolated = make(backend, None, network="none")
        result = backend.exec(isolated, ["python3", "-c", probe])
        routes = run(
            backend, isolated, "cat /proc/net/route | tail -n +2; ls /sys/class/net 2>/dev/null"
        )
        shared = make(backend, None, network="open")
        reached = backend.exec(shared, ["python3", "-c", probe])
        waiter.join()
    assert result.output.startswith(b"refused"), result.output
    assert routes.output.strip() == b"", routes.output  # no route at all, only loopback
    assert reached.output.startswith(b"connected"), reached.output  # the probe itself works
    assert accepted == [True]


def _accept(server: socket.socket, accepted: list[object]) -> None:
    try:
        conn, _ = server.accept()
        conn.close()
        accepted.append(True)
    except OSError:
        accepted.append(False)


def test_limits_are_visible_and_enforced(backend: LocalSandboxBackend) -> None:
    handle = make(backend, None)
    seen = run(
        backend,
        handle,
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max "
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us",
    )
    assert seen.output.decode().split() == [str(192 * 1024 * 1024), "40", "50000", "100000"]
    hog = backend.exec(handle, ["python3", "-c", "b = bytearray(400 * 1024 * 1024); print('ok')"])
    assert hog.exit_code != 0 and b"ok" not in hog.output
    forks = run(backend, handle, "for i in $(seq 1 60); do sleep 2 & done 2>&1; wait", timeout_s=30)
    assert b"fork" in forks.output.lower() or b"resource" in forks.output.lower(), forks.output


def test_submission_outlives_the_sandbox_and_reconcile(
    backend: LocalSandboxBackend, task_dir: Path
) -> None:
    first = make(backend, task_dir, name="ws-restart")
    run(backend, first, "echo kept > notes.txt && git add notes.txt")
    backend.stop(first)
    assert backend.status(first) is WorkspaceState.STOPPED
    with pytest.raises(WorkspaceError, match="stopped"):
        run(backend, first, "true")
    backend.destroy(first, keep_submission=True)
    again = make(backend, task_dir, name="ws-restart-2", submission_volume=first.submission_volume)
    assert run(backend, again, "cat notes.txt").output == b"kept\n"
    orphan = make(backend, None, name="ws-orphan")
    assert backend.reconcile({"ws-restart-2"}) == []  # fresh: maybe not yet committed
    assert backend.reconcile({"ws-restart-2"}, min_age_s=0) == ["ws-orphan"]
    assert backend.status(orphan) is WorkspaceState.MISSING
    assert backend.status(again) is WorkspaceState.RUNNING
    assert (backend.root / "submissions" / orphan.submission_volume).exists()  # the work is kept


def test_refuses_what_it_cannot_give(backend: LocalSandboxBackend) -> None:
    with pytest.raises(WorkspaceError, match="userland"):
        backend.create(WorkspaceSpec(name="x", image="baseline/workspace:cpu", profile=PROFILE))
    with pytest.raises(WorkspaceError, match="GPUs"):
        backend.create(WorkspaceSpec(name="y", image="host", profile=PROFILE, gpu_device_ids=["0"]))
    with pytest.raises(WorkspaceError, match="name"):
        backend.create(WorkspaceSpec(name="../evil", image="host", profile=PROFILE))
