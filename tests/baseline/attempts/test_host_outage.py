"""A lost host, against the real dockerd and the real sshd: an attempt on an ssh:// host is
paused for exactly the outage the probes observed, then moved to a second host from its latest
snapshot (automatically), and its clock and snapshots stay exact."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import TypeVar

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.attempts import clock, host_outage
from baseline.attempts.snapshots import DirectorySource, HelperSource, resolve_source, take_snapshot
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput
from baseline.models import (
    Attempt,
    AttemptStatus,
    Host,
    PauseReason,
    Snapshot,
    SnapshotKind,
    Study,
    StudyTask,
    Task,
    TaskKind,
    Workspace,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces import workspaces
from infra import remote
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend
from tests.baseline.attempt_world import agent_attempt_rows
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, new_name, test_image

pytestmark = [pytest.mark.docker, pytest.mark.sshd]
__all__ = ["test_image"]

T = TypeVar("T")
DEAD_URL = "ssh://root@127.0.0.1:1"  # nothing listens: the host "does not answer"


def _row(session: Session, model: type[T], key: int) -> T:
    row = session.get(model, key)
    assert row is not None
    return row


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


def _started_attempt(session: Session) -> Attempt:
    study = Study(name=new_name("study"), hardware_profile="cpu")
    task = Task(slug=new_name("task"), title="t", kind=TaskKind.PAPER, content_hash="0" * 64)
    session.add_all([study, task])
    session.flush()
    session.add(StudyTask(study_id=study.id, task_id=task.id))
    return agent_attempt_rows(session, study, task)


@pytest.fixture
def two_hosts(ctx: Context) -> Iterator[tuple[int, int, str]]:
    """`remote` (ssh://, the real sshd) and `local` (the socket), both healthy."""
    ssh_url = docker_url("ssh")
    docker_url("unix")
    with ctx.session() as session:
        far = workspaces.add_host(session, "remote", ssh_url, None)
        near = workspaces.add_host(session, "local", LOCAL_URL, None)
        for host in (far, near):
            health = workspaces.check_host(session, host)
            assert health.healthy, health.error
        ids = (far.id, near.id)
    yield ids[0], ids[1], ssh_url
    with ctx.session() as session:  # everything made here goes, the moved-from volume too
        far = _row(session, Host, ids[0])
        assert far is not None
        far.docker_url = ssh_url
        for workspace in session.scalars(select(Workspace)):
            if workspace.status is WorkspaceStatus.DESTROYED and workspace.host_id:
                host = _row(session, Host, workspace.host_id)
                backend = factory(host)
                backend.destroy(workspaces.handle_of(workspace))
                backend.close()  # type: ignore[attr-defined]
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def _recording(seen: list[remote.HostHealth]) -> host_outage.HealthCheck:
    def check(url: str) -> remote.HostHealth:
        health = remote.check_host(url, timeout_s=10)
        seen.append(health)
        return health

    return check


def _write(ctx: Context, workspace_id: int, text: str) -> None:
    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None and workspace.host_id is not None
        host = session.get(Host, workspace.host_id)
        assert host is not None
        backend = factory(host)
        result = backend.exec(
            workspaces.handle_of(workspace),
            ["sh", "-c", f"printf '{text}' > /home/submission/notes.txt"],
        )
        assert result.exit_code == 0, result.output
        backend.close()  # type: ignore[attr-defined]


def _snapshot(ctx: Context, attempt_id: int, expected: type) -> Snapshot:
    """A manual snapshot through the default resolver (what the scheduler uses)."""
    with ctx.session() as session:
        attempt = _row(session, Attempt, attempt_id)
        assert attempt is not None
        source = resolve_source(session, attempt)
        assert isinstance(source, expected)
    return take_snapshot(ctx, attempt_id, SnapshotKind.MANUAL, None, source)


@pytest.mark.sqlite_only("the SSH host's outage and the move")
def test_lost_ssh_host_pauses_for_the_outage_then_moves_from_the_latest_capture(
    ctx: Context, two_hosts: tuple[int, int, str], test_image: str
) -> None:
    far_id, near_id, ssh_url = two_hosts
    with ctx.session() as session:
        near = session.get(Host, near_id)
        assert near is not None
        near.enabled = False  # the attempt starts on the remote host
        attempt = _started_attempt(session)
        ws = workspaces.request_workspace(
            session, image=test_image, hardware_profile="cpu", attempt=attempt,
            backend_factory=factory,
        )  # fmt: skip
        assert ws.host_id == far_id and ws.status is WorkspaceStatus.RUNNING
        near.enabled = True
        attempt.status = AttemptStatus.RUNNING
        attempt.started_at = utcnow()
        attempt_id, first_ws = attempt.id, ws.id
    _write(ctx, first_ws, "captured")
    captured = _snapshot(ctx, attempt_id, HelperSource)  # ssh://: hashed on the host

    # The host stops answering: the next probe pauses the attempt at that probe's time.
    seen: list[remote.HostHealth] = []
    with ctx.session() as session:
        far = _row(session, Host, far_id)
        assert far is not None
        far.docker_url = DEAD_URL
        report = host_outage.probe_hosts(ctx, session, check=_recording(seen))
        assert report.paused == [attempt_id] and "remote" in report.down
        assert not far.healthy and far.last_error and far.last_error.startswith("outage:")
        attempt = _row(session, Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.PAUSED
        pause = clock.open_pause(attempt)
        assert pause is not None and pause.reason is PauseReason.OUTAGE
        assert pause.started_at == seen[-1].checked_at
        # Still down: no second pause, the first one stays open.
        assert host_outage.probe_hosts(ctx, session, check=_recording(seen)).paused == []
        assert len(attempt.pauses) == 1
    # The host answers again: the pause ends at that probe's time, exactly the outage observed.
    with ctx.session() as session:
        far = _row(session, Host, far_id)
        assert far is not None
        far.docker_url = ssh_url
        report = host_outage.probe_hosts(ctx, session, check=_recording(seen))
        assert report.resumed == [attempt_id]
        assert far.healthy, far.last_error
        attempt = _row(session, Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.RUNNING
        (pause,) = attempt.pauses
        assert (pause.started_at, pause.ended_at) == (seen[0].checked_at, seen[-1].checked_at)
        started = attempt.started_at
        assert started is not None
        at = utcnow()
        assert pause.ended_at is not None
        outage = (pause.ended_at - pause.started_at).total_seconds()
        expected = (at - started).total_seconds() - outage
        assert clock.state(attempt, at).working_s == pytest.approx(expected, abs=1e-6)

    # Lost again, and the study moves automatically: a new workspace on `local`, seeded from
    # the latest snapshot; the write after that snapshot stays on the old volume only.
    _write(ctx, first_ws, "after the capture")
    with ctx.session() as session:
        far = _row(session, Host, far_id)
        attempt = _row(session, Attempt, attempt_id)
        assert far is not None and attempt is not None
        attempt.study.outage_move = "automatic"
        far.docker_url = DEAD_URL
        report = host_outage.probe_hosts(
            ctx, session, check=_recording(seen), backend_factory=factory, move_after_s=0
        )
        assert report.paused == [attempt_id], report
        assert report.moved == {attempt_id: "local"}, report.errors
        assert attempt.status is AttemptStatus.RUNNING and clock.open_pause(attempt) is None
        old = session.get(Workspace, first_ws)
        assert old is not None and old.status is WorkspaceStatus.DESTROYED
        new = host_outage.attempt_workspace(session, attempt)
        assert new is not None and new.id != first_ws and new.host_id == near_id
        assert new.status is WorkspaceStatus.RUNNING
        second = attempt.pauses[-1]
        assert second.reason is PauseReason.OUTAGE and second.ended_at is not None
        assert second.ended_at - second.started_at >= timedelta(0)
        backend = factory(near)
        got = backend.exec(workspaces.handle_of(new), ["cat", "/home/submission/notes.txt"])
        backend.close()  # type: ignore[attr-defined]
        assert got.output == b"captured"
    # Nothing captured is lost, and the new workspace is what the next snapshot reads.
    after = _snapshot(ctx, attempt_id, DirectorySource)  # the local engine's volume
    with ctx.session() as session:
        rows = list(session.scalars(select(Snapshot).where(Snapshot.attempt_id == attempt_id)))
        assert [r.id for r in rows] == [captured.id, after.id]
        assert (after.file_count, after.total_bytes) == (captured.file_count, captured.total_bytes)
        attempt = _row(session, Attempt, attempt_id)
        assert attempt is not None
        with pytest.raises(InvalidInput, match="is on local already"):
            host_outage.move_attempt(
                ctx, session, attempt, to_host=session.get(Host, near_id), backend_factory=factory
            )


def test_moving_needs_a_capture(ctx: Context) -> None:
    """Refused before any host is touched: the host needs no check (nor a container)."""
    with ctx.session() as session:
        host = workspaces.add_host(session, "remote", docker_url("ssh"), None)
        attempt = _started_attempt(session)
        attempt.status = AttemptStatus.RUNNING
        session.add(
            Workspace(
                attempt_id=attempt.id,
                purpose=workspaces.WorkspacePurpose.ATTEMPT,
                backend="docker",
                name=new_name("ws"),
                image="x",
                hardware_profile="cpu",
                host_id=host.id,
                status=WorkspaceStatus.RUNNING,
            )
        )
        session.flush()
        with pytest.raises(Conflict, match="no snapshot yet"):
            host_outage.move_attempt(ctx, session, attempt, backend_factory=factory)
