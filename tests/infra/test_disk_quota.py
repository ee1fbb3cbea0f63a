"""A workspace cannot fill the host's disk, and what it writes does not grow the orchestrator.

This engine's storage driver (overlay2 on ext4) has no per-container quota: `backend_for_host`
asks for the profile's disk bound, and the backend falls back to size-limited tmpfs wherever
the workspace user can write (see `DockerBackend`).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from baseline.models import Host
from baseline.workspaces import backend_for_host
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.snapshots import capture_directory
from infra.workspace import HardwareProfile, WorkspaceHandle, WorkspaceSpec
from scoring.reproduction import ReproductionOptions, reproduce_in_workspace
from tests.docker_env import TEST_LABELS, docker_url, new_name, workspace_image

pytestmark = pytest.mark.docker

GIB = 1 << 30


@pytest.fixture
def bounded() -> Iterator[tuple[DockerBackend, WorkspaceHandle]]:
    """A reproduction workspace made through `backend_for_host`, with a 1 GiB disk profile."""
    backend = backend_for_host(Host(name="local", docker_url=docker_url("unix")))
    assert isinstance(backend, DockerBackend)
    backend.labels.update(TEST_LABELS)  # so that the leak check sees what this test made
    profile = HardwareProfile(name="disk-1g", cpus=1, memory_mb=3072, pids=128, disk_gb=1)
    handle = backend.create(
        WorkspaceSpec(
            name=new_name(),
            image=workspace_image(),
            profile=profile,
            labels={"baseline.purpose": "reproduction"},
        )
    )
    try:
        backend.start(handle)
        yield backend, handle
    finally:
        backend.destroy(handle)
        backend.close()


def _written(backend: DockerBackend, handle: WorkspaceHandle, path: str) -> int:
    """Bytes that landed after trying to write 1.2 GiB to `path`."""
    script = f"dd if=/dev/zero of={path} bs=1M count=1230 2>/dev/null; stat -c %s {path}"
    result = backend.exec(handle, ["sh", "-c", script], timeout_s=120)
    return int(result.output.decode().split()[-1])


def test_workspace_writes_are_bounded_by_the_profile_disk(
    bounded: tuple[DockerBackend, WorkspaceHandle],
) -> None:
    backend, handle = bounded
    for path in ("/tmp/fill", "/var/tmp/fill", "/home/participant/fill", "/home/submission/fill"):
        assert _written(backend, handle, path) <= GIB, path
        backend.exec(handle, ["rm", "-f", path], timeout_s=30)
    # nowhere else to write: what the user can write on the root file system is a tmpfs mount
    script = "find / -xdev -writable -not -type l 2>/dev/null | head -50"
    writable = set(backend.exec(handle, ["sh", "-c", script], timeout_s=120).output.split())
    mounts = backend.exec(handle, ["cat", "/proc/mounts"], timeout_s=30).output.splitlines()
    tmpfs = {line.split()[1] for line in mounts if line.split()[2] == b"tmpfs"}
    assert b"/tmp" in writable and writable <= tmpfs, writable - tmpfs


def test_orchestrator_memory_stays_flat_whatever_the_reproduction_writes(
    bounded: tuple[DockerBackend, WorkspaceHandle], tmp_path: Path
) -> None:
    backend, handle = bounded
    store = BlobStore(tmp_path / "blobs")
    root = tmp_path / "sub"
    root.mkdir()
    (root / "reproduce.sh").write_text(
        "for i in 1 2 3 4 5 6 7 8; do head -c 100000000 /dev/zero > out$i.bin; done\necho done\n"
    )
    digest = capture_directory(root, store).manifest_sha256
    tracemalloc.start()
    try:
        result = reproduce_in_workspace(
            backend, handle, store, digest, ReproductionOptions(timeout_s=120)
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0, store.get_bytes(result.log_sha256)
    assert sorted(result.not_kept) == [f"out{i}.bin" for i in range(1, 9)]  # 800 MB written
    assert peak < 48 << 20, peak
