"""The end of an attempt on the real engine. A human's: every process of the participant ends,
and the audit log records what really happened (issue 39, item 1). An agent's: its container
stops, its submission volume stays (issue 31, item 9)."""

from __future__ import annotations

import io
import tarfile
import time
from typing import Any

import pytest
from sqlalchemy import select

from baseline.attempts import workspace_freeze
from baseline.context import Context
from baseline.models import (
    AgentRunStatus,
    Attempt,
    AttemptStatus,
    AuditEvent,
    Host,
    SnapshotKind,
    Workspace,
    WorkspaceStatus,
)
from baseline.runs.agent_runs import AgentLoop
from baseline.workspaces import workspaces
from baseline.workspaces.backends import open_backend
from infra.workspace import ExecResult, WorkspaceBackend, WorkspaceHandle, WorkspaceState
from tests.agents.agent_world import Script, agent_attempt, bash, call, cleanup, factory
from tests.baseline.cli.test_task_cli import _launched, _workspace
from tests.conftest import Users
from tests.docker_env import test_image
from tests.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]

LOOP = "while true; do date +%s%N >> /home/submission/late.txt; sleep 0.1; done"


def _end(ctx: Context, attempt_id: int) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.status = AttemptStatus.SUBMITTED


def _audit(ctx: Context, attempt_id: int) -> list[AuditEvent]:
    with ctx.session() as session:
        return list(
            session.scalars(
                select(AuditEvent)
                .where(AuditEvent.target_id == str(attempt_id))
                .where(AuditEvent.action.startswith("workspace.freeze"))
            )
        )


def _size(backend: WorkspaceBackend, handle: WorkspaceHandle) -> int:
    listed = backend.exec(handle, ["stat", "-c", "%s", "/home/submission/late.txt"])
    assert listed.exit_code == 0, listed.output
    return int(listed.output)


def test_the_end_kills_a_detached_job_and_the_audit_records_it(
    ctx: Context, users: Users, test_image: str, cleanup: None
) -> None:
    mine, _ = _launched(ctx, users, test_image)
    backend, handle = _workspace(ctx, mine)
    detached = backend.exec(
        handle,
        ["bash", "-c", f"setsid nohup bash -c '{LOOP}' >/dev/null 2>&1 < /dev/null & echo ok"],
        user="participant",
    )
    assert detached.exit_code == 0, detached.output
    deadline = time.monotonic() + 10
    while backend.exec(handle, ["test", "-s", "/home/submission/late.txt"]).exit_code != 0:
        assert time.monotonic() < deadline, "the detached job never wrote"
        time.sleep(0.2)
    _end(ctx, mine)

    assert workspace_freeze.freeze(ctx, mine, factory) is None

    left = backend.exec(handle, ["pgrep", "-u", "participant", "-f", "late.txt"])
    assert left.exit_code == 1, f"still running: {left.output!r}"
    size = _size(backend, handle)
    time.sleep(0.5)
    assert _size(backend, handle) == size
    (event,) = _audit(ctx, mine)
    assert event.action == "workspace.freeze"


class _RefusingKill:
    """The real backend, except that the kill script's exec fails as `docker exec` did with a
    NUL byte in its argument."""

    def __init__(self, inner: WorkspaceBackend) -> None:
        self.inner = inner

    def exec(self, handle: WorkspaceHandle, command: list[str], **kwargs: Any) -> ExecResult:
        if command[:2] == ["python3", "-c"]:
            return ExecResult(
                exit_code=126,
                output=b"exec /usr/bin/timeout: invalid argument",
                timed_out=False,
                duration_s=0.0,
            )
        return self.inner.exec(handle, command, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_kill_that_fails_is_audited_as_a_failed_freeze(
    ctx: Context, users: Users, test_image: str, cleanup: None
) -> None:
    mine, _ = _launched(ctx, users, test_image)
    _end(ctx, mine)

    def refusing(host: Host) -> WorkspaceBackend:
        return _RefusingKill(factory(host))  # type: ignore[return-value]

    problem = workspace_freeze.freeze(ctx, mine, refusing)

    assert problem is not None and "ending the participant's processes" in problem
    assert "invalid argument" in problem
    (event,) = _audit(ctx, mine)
    assert event.action == "workspace.freeze_failed"
    assert "invalid argument" in str(event.details["errors"])


def test_the_kill_script_reaches_docker_exec_without_a_nul_byte() -> None:
    assert "\0" not in workspace_freeze.KILL_ALL
    compile(workspace_freeze.KILL_ALL, "KILL_ALL", "exec")


def test_an_agent_that_ends_its_task_leaves_its_workspace_stopped_with_its_submission(
    ctx: Context, test_image: str, cleanup: None
) -> None:
    script = Script([bash("echo kept > /home/submission/kept.txt"), call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED

    with ctx.session() as session:
        attempt = session.get(Attempt, world.attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.SUBMITTED
        assert SnapshotKind.FINAL in {s.kind for s in attempt.snapshots}
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == world.attempt_id)
        ).one()
        assert workspace.status is WorkspaceStatus.STOPPED
        host = session.get(Host, workspace.host_id)
        assert host is not None
        handle = workspaces.handle_of(workspace)
        # Reconcile does not bring it back.
        report = workspaces.reconcile(session, factory)
        assert workspace.name not in report.restarted + report.died
    with open_backend(factory, host) as backend:
        assert backend.status(handle) is WorkspaceState.STOPPED
        # The container and its submission volume are kept: what the agent left is there.
        archive = backend.get_archive(handle, "/home/submission")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        kept = tar.extractfile("submission/kept.txt")
        assert kept is not None and kept.read() == b"kept\n"
