"""The Docker backend on a real dockerd, over the local socket and over ssh:// (real sshd)."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.docker_backend import DockerBackend, check_task_dir
from infra.workspace import (
    HardwareProfile,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
    WorkspaceSpec,
    WorkspaceState,
)
from tests.docker_env import backend, new_name, test_image, world_readable_tmp

pytestmark = pytest.mark.docker
__all__ = ["backend", "test_image", "world_readable_tmp"]

SMALL = HardwareProfile("test-small", cpus=0.5, memory_mb=256, shm_mb=32, pids=128)
Make = Callable[..., WorkspaceHandle]


@pytest.fixture
def make(backend: DockerBackend, test_image: str) -> Iterator[Make]:
    """Create and start workspaces; every one is destroyed (volumes included) afterwards."""
    made: list[WorkspaceHandle] = []

    def create(start: bool = True, **overrides: object) -> WorkspaceHandle:
        fields: dict[str, object] = {"name": new_name(), "image": test_image, "profile": SMALL}
        fields.update(overrides)
        handle = backend.create(WorkspaceSpec(**fields))  # type: ignore[arg-type]
        made.append(handle)
        if start:
            backend.start(handle)
        return handle

    yield create
    for handle in reversed(made):  # a later workspace may reuse an earlier one's volume
        backend.destroy(handle)


def _tar(files: dict[str, bytes], uid: int = 1000) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.gid, info.mode = len(data), uid, uid, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _untar(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def _run(backend: DockerBackend, handle: WorkspaceHandle, script: str, **kw: object) -> str:
    result = backend.exec(handle, ["sh", "-c", script], **kw)  # type: ignore[arg-type]
    assert result.exit_code == 0, result.output
    return result.output.decode()


def test_backend_implements_the_protocol(backend: DockerBackend) -> None:
    assert isinstance(backend, WorkspaceBackend)


def test_create_exec_copy_in_and_out_destroy(backend: DockerBackend, make: Make) -> None:
    handle = make()
    assert handle.image_digest is not None and handle.image_digest.startswith("sha256:")
    assert backend.status(handle) is WorkspaceState.RUNNING
    assert _run(backend, handle, "git rev-parse --is-inside-work-tree").strip() == "true"
    assert _run(backend, handle, "stat -c %U /home/submission").strip() == "participant"

    backend.put_archive(handle, "/home/submission", _tar({"train.py": b"print('hi')\n"}))
    assert _run(backend, handle, "python3 /home/submission/train.py") == "hi\n"
    _run(
        backend, handle, "echo result > /home/submission/out.txt && git add -A && git commit -qm w"
    )
    files = _untar(backend.get_archive(handle, "/home/submission"))
    assert files["submission/out.txt"] == b"result\n"
    assert files["submission/train.py"] == b"print('hi')\n"

    backend.destroy(handle)
    assert backend.status(handle) is WorkspaceState.MISSING
    assert not backend.client.volumes.list(filters={"name": handle.submission_volume})


def test_limits_are_visible_and_enforced_inside(backend: DockerBackend, make: Make) -> None:
    handle = make()
    # cgroup v1 and v2 name the files differently; read whichever exists.
    memory = _run(
        backend,
        handle,
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes "
        "2>/dev/null || cat /sys/fs/cgroup/memory.max",
    )
    assert int(memory) == SMALL.memory_mb * 1024 * 1024
    pids = _run(
        backend,
        handle,
        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
    )
    assert int(pids) == SMALL.pids
    cpu = _run(
        backend,
        handle,
        "cd /sys/fs/cgroup; if [ -f cpu.max ]; then cat cpu.max;"
        " else echo $(cat cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us); fi",
    )
    quota, period = (int(x) for x in cpu.split())
    assert quota / period == pytest.approx(SMALL.cpus)
    shm_kb = _run(backend, handle, "df -k /dev/shm | awk 'NR==2 {print $2}'")
    assert int(shm_kb) == SMALL.shm_mb * 1024
    # Enforced, not only displayed: allocating twice the memory limit gets the process killed.
    hog = backend.exec(
        handle, ["python3", "-c", "b = bytearray(512 * 1024 * 1024); print('survived')"]
    )
    assert hog.exit_code != 0 and b"survived" not in hog.output


def test_no_network_means_no_route_out(backend: DockerBackend, make: Make) -> None:
    closed = make(network="none")
    routes = _run(backend, closed, "cat /proc/net/route").strip().splitlines()
    assert len(routes) == 1  # the header only: no interface but loopback, no default route
    probe = (
        "import socket\ns = socket.socket(); s.settimeout(3)\n"
        "try:\n    s.connect(('172.17.0.1', 9)); print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)"
    )
    assert _run(backend, closed, f'python3 -c "{probe}"').startswith("refused 101")  # ENETUNREACH


def test_paper_is_read_only_and_the_rubric_is_nowhere(
    backend: DockerBackend, make: Make, world_readable_tmp: Path
) -> None:
    source = world_readable_tmp / "source"
    source.mkdir()
    marker = "RUBRIC-MARKER-7f3a9c only graders may read this"
    (source / "paper.md").write_text("# The paper\n")
    (source / "addendum.md").write_text("clarifications\n")
    (source / "rubric.json").write_text(f'{{"requirements": "{marker}"}}')
    (source / "judge.addendum.md").write_text(marker)
    with pytest.raises(WorkspaceError, match="grading material"):
        check_task_dir(source)
    # The participant-visible materialisation: everything but the grading files.
    paper = world_readable_tmp / "paper"
    paper.mkdir()
    for name in ("paper.md", "addendum.md"):
        (paper / name).write_bytes((source / name).read_bytes())
    paper.chmod(0o755)

    handle = make(task_dir=paper)
    assert _run(backend, handle, "cat /home/paper/paper.md") == "# The paper\n"
    for user in ("participant", "root"):
        denied = backend.exec(handle, ["touch", "/home/paper/new"], user=user)
        assert denied.exit_code != 0 and b"Read-only" in denied.output
    search = backend.exec(
        handle,
        [
            "grep",
            "-rlF",
            "RUBRIC-MARKER-7f3a9c",
            "/",
            "--exclude-dir=proc",
            "--exclude-dir=sys",
            "--exclude-dir=dev",
        ],
        user="root",
        timeout_s=120,
    )
    assert search.exit_code == 1, search.output  # grep: 1 = searched everything, found nothing


def test_participant_is_not_root_and_no_docker_socket(backend: DockerBackend, make: Make) -> None:
    handle = make()
    assert _run(backend, handle, "id -u").strip() != "0"
    found = _run(
        backend,
        handle,
        "find / -xdev -name docker.sock 2>/dev/null; "
        "ls /var/run/docker.sock /run/docker.sock 2>&1 || true",
    )
    assert "No such file" in found and found.count("docker.sock") == 2  # only the two misses
    mounts = backend.client.containers.get(handle.name).attrs["Mounts"]
    assert all("docker.sock" not in str(m.get("Source")) for m in mounts)
    assert {m["Destination"] for m in mounts} == {"/home/submission"}


def test_exec_streams_times_out_and_caps_output(backend: DockerBackend, make: Make) -> None:
    handle = make()
    chunks: list[bytes] = []
    slow = backend.exec(
        handle, ["sh", "-c", "echo start; sleep 30 & wait"], timeout_s=1, on_output=chunks.append
    )
    assert slow.timed_out and slow.exit_code is None
    assert slow.duration_s < 8
    assert b"start" in b"".join(chunks) and slow.output.startswith(b"start")
    assert "sleep 30" not in _run(backend, handle, "ps -eo args")  # the child was killed too
    big = backend.exec(handle, ["head", "-c", "200000", "/dev/zero"], max_output_bytes=1000)
    assert big.exit_code == 0 and big.truncated and len(big.output) == 1000
    failing = backend.exec(handle, ["sh", "-c", "exit 3"], timeout_s=30)
    assert failing.exit_code == 3 and not failing.timed_out


def test_a_timeout_reads_as_one_when_the_engine_answers_the_start_late(
    backend: DockerBackend, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded engine `exec_start` answered after much of the timeout had passed; the time
    was counted from its answer, so `timeout`'s 124 read as the command's own exit code (CI:
    the API agent's `sleep 30` with a 1 s timeout came back not timed out)."""
    handle = make()
    start = backend.api.exec_start

    def answered_late(*args: Any, **kwargs: Any) -> Any:
        started = start(*args, **kwargs)
        time.sleep(1.5)  # the command runs meanwhile, and `timeout` stops it at 1 s
        return started

    monkeypatch.setattr(backend.api, "exec_start", answered_late)
    slow = backend.exec(handle, ["sleep", "30"], timeout_s=1)
    assert slow.timed_out and slow.exit_code is None, slow


def test_submission_outlives_the_container(backend: DockerBackend, make: Make) -> None:
    first = make()
    _run(backend, first, "echo kept > notes.txt && git add -A && git commit -qm one")
    backend.destroy(first, keep_submission=True)
    assert backend.status(first) is WorkspaceState.MISSING
    second = make(submission_volume=first.submission_volume)
    assert _run(backend, second, "cat notes.txt; git log --format=%s") == "kept\none\n"


def test_reconcile_removes_only_workspaces_that_are_not_live(
    backend: DockerBackend, make: Make
) -> None:
    live, orphan = make(), make(start=False)
    # A fresh container may be another transaction's, not yet committed: kept for now.
    assert backend.reconcile({live.name}) == []
    assert backend.status(orphan) is WorkspaceState.CREATED
    removed = backend.reconcile({live.name}, min_age_s=0)
    assert removed == [orphan.name]
    assert backend.status(orphan) is WorkspaceState.MISSING
    assert backend.status(live) is WorkspaceState.RUNNING


def test_bad_specs_are_refused(backend: DockerBackend, make: Make, test_image: str) -> None:
    with pytest.raises(WorkspaceError, match="not on this host"):
        make(image="baseline-no-such-image:1")
    with pytest.raises(WorkspaceError, match="does not exist"):
        make(network="baseline-no-such-network")
    with pytest.raises(WorkspaceError, match="needs 1 GPU"):
        make(profile=HardwareProfile("gpu", gpu_model="NVIDIA A10", gpu_count=1))
    with pytest.raises(WorkspaceError, match="not a valid workspace name"):
        make(name="../escape")
    taken = make(start=False)
    with pytest.raises(WorkspaceError, match="exists already"):
        make(name=taken.name)


def test_gpus_reach_the_engine_as_device_requests(backend: DockerBackend, make: Make) -> None:
    """No GPU here, so the container is created (not started) and its HostConfig inspected."""
    profile = HardwareProfile("gpu2", gpu_model="NVIDIA H100", gpu_count=2)
    handle = make(start=False, profile=profile, gpu_device_ids=["3", "1"])
    requests = backend.client.api.inspect_container(handle.container_id)["HostConfig"][
        "DeviceRequests"
    ]
    assert len(requests) == 1
    assert requests[0]["DeviceIDs"] == ["3", "1"]
    assert requests[0]["Capabilities"] == [["gpu"]]
