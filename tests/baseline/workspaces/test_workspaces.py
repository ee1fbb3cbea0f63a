"""Placement, pending, destroy and reconcile of workspaces against the real dockerd."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    Host,
    Study,
    StudyTask,
    Task,
    TaskKind,
    WorkspaceStatus,
)
from baseline.workspaces import gpu_allocation, workspaces
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend, WorkspaceSpec, WorkspaceState
from tests.baseline.attempt_world import agent_attempt_rows
from tests.baseline.workspaces.gpu_holder import holding_gpus
from tests.docker_env import (
    LOCAL_URL,
    TEST_LABELS,
    docker_url,
    new_name,
    test_image,
)

pytestmark = pytest.mark.docker
__all__ = ["test_image"]


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


def _attempt(session: Session, profile: str = "cpu") -> Attempt:
    study = Study(name=new_name("study"), hardware_profile=profile)
    task = Task(slug=new_name("task"), title="t", kind=TaskKind.PAPER, content_hash="0" * 64)
    session.add_all([study, task])
    session.flush()
    session.add(StudyTask(study_id=study.id, task_id=task.id))
    return agent_attempt_rows(session, study, task, hardware_profile=profile)


@pytest.fixture
def local_host(ctx: Context) -> Iterator[int]:
    docker_url("unix")
    with ctx.session() as session:
        host = workspaces.add_host(
            session, "local", LOCAL_URL, None, declared_gpus=[{"model": "NVIDIA A10", "count": 1}]
        )
        health = workspaces.check_host(session, host)
        assert health.healthy, health.error
        host_id = host.id
    yield host_id
    with ctx.session() as session:  # whatever a test left live is destroyed, volumes included
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def test_place_records_digest_and_labels_then_destroy(
    ctx: Context, local_host: int, test_image: str
) -> None:
    with ctx.session() as session:
        attempt = _attempt(session)
        ws = workspaces.request_workspace(
            session,
            image=test_image,
            hardware_profile="cpu",
            attempt=attempt,
            backend_factory=factory,
        )
        assert ws.status is WorkspaceStatus.RUNNING and ws.host_id == local_host
        assert attempt.status is AttemptStatus.READY
        assert attempt.image_digest is not None and attempt.image_digest == ws.image_digest
        assert attempt.image_digest.startswith("sha256:")
        backend = factory(session.get(Host, local_host))  # type: ignore[arg-type]
        assert isinstance(backend, DockerBackend)
        labels = backend.client.containers.get(ws.name).labels
        assert labels["baseline.attempt"] == str(attempt.id)
        assert labels["baseline.workspace"] == ws.name
        workspaces.destroy(session, ws, factory)
        assert ws.status is WorkspaceStatus.DESTROYED
        assert backend.status(workspaces.handle_of(ws)) is WorkspaceState.MISSING
        assert not backend.client.volumes.list(filters={"name": ws.submission_volume})


def test_pending_while_no_gpu_is_free_and_visible(
    ctx: Context, local_host: int, test_image: str
) -> None:
    with ctx.session() as session:
        host = session.get(Host, local_host)
        assert host is not None
        holder = holding_gpus(session, host)
        attempt = _attempt(session, profile="a10")
        ws = workspaces.request_workspace(
            session,
            image=test_image,
            hardware_profile="a10",
            attempt=attempt,
            backend_factory=factory,
        )
        assert ws.status is WorkspaceStatus.PENDING and ws.host_id is None
        assert attempt.status is AttemptStatus.PENDING
        assert ws.container_id is None
        holder.status = WorkspaceStatus.DESTROYED
        gpu_allocation.release(session, holder)
        # Now the GPU is free; this machine has no NVIDIA runtime, so the engine refuses the
        # container and the workspace stays pending with the reason, its GPU released again.
        report = workspaces.reconcile(session, factory)
        assert ws.name not in report.placed and ws.status is WorkspaceStatus.PENDING
        assert ws.last_error and "local" in ws.last_error
        assert not gpu_allocation.live_assignments(session, ws)


def test_reconcile_removes_orphans_and_restarts_the_dead(
    ctx: Context, local_host: int, test_image: str
) -> None:
    with ctx.session() as session:
        ws = workspaces.request_workspace(
            session,
            image=test_image,
            hardware_profile="cpu",
            backend_factory=factory,
            attempt=_attempt(session),  # an attempt's: a disposable one is its job's alone
        )
        host = session.get(Host, local_host)
        assert host is not None
        backend = factory(host)
        assert isinstance(backend, DockerBackend)
        handle = workspaces.handle_of(ws)
        backend.exec(handle, ["sh", "-c", "echo safe > notes.txt"])
        orphan = backend.create(
            WorkspaceSpec(
                name=new_name("orphan"), image=test_image, profile=workspaces._profile("cpu")
            )
        )
        try:
            fresh = workspaces.reconcile(session, factory)
            backend.client.containers.get(ws.name).kill()
            report = workspaces.reconcile(session, factory, orphan_min_age_s=0)
        finally:
            backend.destroy(orphan)
        assert orphan.name not in fresh.removed["local"]  # a workspace another session creates
        assert orphan.name in report.removed["local"]
        assert report.died == [ws.name] and report.restarted == [ws.name]
        assert ws.status is WorkspaceStatus.RUNNING
        assert backend.exec(handle, ["cat", "notes.txt"]).output == b"safe\n"
