"""A reproduction for an attempt on a GPU profile, with only a remote (ssh://) GPU host: queued,
not refused, while the host's GPU is held; tried again on the same host through the same
allocator once it is free."""

from __future__ import annotations

from pathlib import Path

import pytest

from baseline.context import Context
from baseline.grading import reproductions
from baseline.models import (
    Attempt,
    Host,
    JobStatus,
    Snapshot,
    Workspace,
    WorkspaceStatus,
)
from baseline.workspaces import gpu_allocation, workspaces
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend
from tests.baseline.workspaces.gpu_holder import holding_gpus
from tests.docker_env import TEST_LABELS, docker_url, test_image
from tests.scoring.scoring_world import build_world, snapshot_reference

pytestmark = [pytest.mark.docker, pytest.mark.sshd]
__all__ = ["test_image"]


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


@pytest.mark.sqlite_only("the remote host's GPU queue")
def test_reproduction_on_a_busy_remote_gpu_host_is_queued_with_the_reason(
    ctx: Context, tmp_path: Path, test_image: str
) -> None:
    ssh_url = docker_url("ssh")
    world = build_world(ctx, image_digest=test_image)
    with ctx.session() as session:
        attempt = session.get(Attempt, world.attempt_id)
        assert attempt is not None
        attempt.hardware_profile = "a10"
        host = workspaces.add_host(
            session,
            "remote-gpu",
            ssh_url,
            None,
            declared_gpus=[{"model": "NVIDIA A10", "count": 1}],
        )
        assert workspaces.check_host(session, host).healthy, host.last_error
        holder = holding_gpus(session, host)
        holder_id = holder.id
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "ref")
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        reproduction_id = reproductions.queue_reproduction(session, snapshot).id

    row = reproductions.run_reproduction(ctx, reproduction_id, backend_factory=factory)
    assert row.status is JobStatus.QUEUED and row.started_at is None
    assert "no workspace for the reproduction" in row.details["waiting"]
    assert row.hardware_profile == "a10"

    with ctx.session() as session:  # the GPU is freed: the same host is tried for it
        freed = session.get(Workspace, holder_id)
        assert freed is not None
        freed.status = WorkspaceStatus.DESTROYED
        gpu_allocation.release(session, freed)
    row = reproductions.run_reproduction(ctx, reproduction_id, backend_factory=factory)
    # This machine has no NVIDIA runtime: the engine refuses the GPU container, so the
    # reproduction waits again, now naming the host that was tried, its GPU released.
    assert row.status is JobStatus.QUEUED
    assert "remote-gpu" in row.details["waiting"]
    with ctx.session() as session:
        live = workspaces.live_workspaces(session)
        assert not [w for w in live if gpu_allocation.live_assignments(session, w)]
