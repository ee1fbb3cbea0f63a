"""Launching attempts on the real dockerd: workspace placed, task files in, clock started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from baseline.attempts import launch
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput
from baseline.models import (
    Attempt,
    AttemptStatus,
    Host,
    Participant,
    PauseReason,
    Role,
    Snapshot,
    SnapshotKind,
    Workspace,
)
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import egress_gateway, workspaces
from infra.docker_backend import DockerBackend
from infra.egress.proxy import EgressProxyError
from infra.workspace import WorkspaceBackend
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, test_image

pytestmark = pytest.mark.docker
__all__ = ["test_image"]


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


def _no_image(profile: str) -> str:
    raise AssertionError("the tests pass the image explicitly")


@pytest.fixture
def cleanup(ctx: Context) -> Iterator[None]:
    docker_url("unix")
    yield
    with ctx.session() as session:
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def _add_local_host(ctx: Context) -> None:
    with ctx.session() as session:
        host = workspaces.add_host(session, "local", LOCAL_URL, None)
        assert workspaces.check_host(session, host).healthy


def _attempt(ctx: Context, *, agent: bool, egress: str = "none") -> int:
    with ctx.session() as session:
        study = studies.create_study(
            session, studies.StudySpec(name=f"launch {agent} {egress}", egress_policy=egress), None
        )
        paper_task = tasks.import_demo_tasks(session, ctx.settings)[0]
        studies.add_task(session, study, paper_task, None)
        session.flush()
        session.refresh(study)
        if agent:
            participant = studies.add_agent(
                session, study, "agent", "basic", "m", "http://127.0.0.1:9/v1", None, None
            )
        else:
            user = accounts.create_user(
                session, "human@test.example", "Human", "password123", Role.PARTICIPANT
            )
            participant = studies.enroll_human(session, study.id, user, None)
        return studies.create_attempt(session, participant, paper_task, None).id


def _run(ctx: Context, attempt_id: int, command: str) -> str:
    with ctx.session() as session:
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == attempt_id)
        ).one()
        handle = workspaces.handle_of(workspace)
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        result = backend.exec(handle, ["bash", "-lc", command], timeout_s=30)
    finally:
        backend.close()
    assert result.exit_code == 0, result.output
    return result.output.decode()


def test_agent_attempt_runs_with_task_files_and_start_snapshot(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    _add_local_host(ctx)
    attempt_id = _attempt(ctx, agent=True)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.started_at is not None
        assert attempt.image_digest and attempt.image_digest.startswith("sha256:")
        kinds = session.scalars(select(Snapshot.kind).where(Snapshot.attempt_id == attempt_id))
        assert SnapshotKind.START in set(kinds)
    listing = _run(ctx, attempt_id, "ls -a /home/paper; ls -a /home/submission")
    assert "paper.md" in listing and "addendum.md" in listing and ".git" in listing
    assert "rubric.json" not in listing and "judge.addendum.md" not in listing
    with pytest.raises(Conflict, match="launched already"):
        launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)


def test_human_attempt_waits_for_first_login(ctx: Context, cleanup: None, test_image: str) -> None:
    _add_local_host(ctx)
    attempt_id = _attempt(ctx, agent=False)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.READY
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        assert [p.reason for p in attempt.pauses if p.ended_at is None] == [PauseReason.NOT_STARTED]


def test_without_a_host_the_attempt_waits_then_starts(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    attempt_id = _attempt(ctx, agent=True)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.PENDING
    assert launch.start_placed_attempts(ctx) == []
    _add_local_host(ctx)
    with ctx.session() as session:
        report = workspaces.reconcile(session, factory)
        assert len(report.placed) == 1
    assert launch.start_placed_attempts(ctx) == [attempt_id]
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.RUNNING


def test_blacklist_egress_without_mitmdump_is_refused_with_a_reason(
    ctx: Context, cleanup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> str:
        raise EgressProxyError("mitmdump not found: run scripts/services/25-egress.sh")

    monkeypatch.setattr(egress_gateway, "find_mitmdump", missing)
    _add_local_host(ctx)
    attempt_id = _attempt(ctx, agent=True, egress="blacklist")
    with pytest.raises(InvalidInput, match="egress proxy is unavailable: mitmdump not found"):
        launch.launch(ctx, attempt_id, None, image="unused", backend_factory=factory)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.PENDING
        assert session.scalars(select(Workspace)).all() == []
        assert session.scalars(select(Participant)).all()
